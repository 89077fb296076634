"""Data parallelism across datacenters: whole pipelines inside each DC, gradients all-reduced
over the WAN. The usual way to span DCs, and the one the WAN hurts most."""

from __future__ import annotations

from testbed.policy.api import (
    Job,
    Plan,
    PlanningContext,
    Schedule,
    Topology,
    TrainingPolicy,
    build_plan,
    dc_pipelines,
)


class DpAcrossDcPolicy(TrainingPolicy):
    name = "dp-across-dc"
    summary = "1F1B pipelines kept inside each DC, gradient all-reduce across DCs over the WAN"

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        # the placement holds every whole pipeline that fits: that is the plan's dp
        return build_plan(self.name, topology, job, dc_pipelines(topology, job),
                          Schedule.ONE_F_ONE_B)
