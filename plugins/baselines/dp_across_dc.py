"""Data parallelism across datacenters: whole pipelines inside each DC, gradients all-reduced
over the WAN. The usual way to span DCs, and the one the WAN hurts most."""

from __future__ import annotations

from testbed.policy.api import (
    InputError,
    Job,
    Plan,
    PlanningContext,
    Schedule,
    Topology,
    TrainingPolicy,
    Worker,
    build_plan,
)


class DpAcrossDcPolicy(TrainingPolicy):
    name = "dp-across-dc"
    summary = "1F1B pipelines kept inside each DC, gradient all-reduce across DCs over the WAN"

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        tp = job.tp
        smallest = min(dc.gpus for dc in topology.datacenters) // tp
        pp = job.pp if job.pp is not None else max(1, min(smallest, job.model.layers))
        placement: dict[Worker, tuple[str, ...]] = {}
        replica = 0
        for dc in topology.datacenters:
            hosts = dc.host_names()
            for first in range(0, dc.gpus - pp * tp + 1, pp * tp):
                if job.dp is not None and replica >= job.dp:
                    break
                for stage in range(pp):
                    start = first + stage * tp
                    placement[(replica, stage)] = tuple(hosts[start : start + tp])
                replica += 1
        if replica == 0:
            raise InputError(
                f"a pipeline of pp {pp} x tp {tp} = {pp * tp} GPUs fits in no datacenter",
                topology.source,
                "job.pp",
            )
        if job.dp is not None and replica < job.dp:
            raise InputError(
                f"only {replica} whole pipelines of {pp * tp} GPUs fit inside "
                f"datacenters, job asks dp {job.dp}",
                topology.source,
                "job.dp",
            )
        # the placement holds `replica` whole pipelines: that is the plan's dp
        return build_plan(self.name, topology, job, placement, Schedule.ONE_F_ONE_B)
