"""A pipeline with its stages in file order and several TCP connections per cross-DC peer
pair, so that one window-limited flow does not cap a long WAN link."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.policy.api import (
    InputError,
    Job,
    LinkKind,
    Plan,
    PlanningContext,
    Schedule,
    Topology,
    TrainingPolicy,
    at_least_one,
    build_plan,
    default_pp,
    file_order_placement,
    one_of,
    setting,
)


@dataclass(frozen=True)
class StripedSettings:
    """Each field is an option, `-o connections=8`: its default, help and parser."""

    connections: int = setting(4, "TCP connections per cross-DC pipeline peer pair",
                               at_least_one)
    schedule: str = setting("auto", "gpipe, 1f1b, or auto: the one the simulator finds "
                            "faster", one_of("auto", "gpipe", "1f1b"))


class StripedPipeline(TrainingPolicy):
    name = "striped-pipeline"  # must equal the entry-point name
    summary = "stages in file order, N TCP connections per cross-DC peer pair"
    api_version = 2  # the policy API this was written for
    settings_type: ClassVar[type[Any]] = StripedSettings  # what -o sets
    settings: StripedSettings  # so the hooks below read typed fields

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        tp = job.tp  # GPUs per tensor-parallel group
        pp = default_pp(topology, job)  # job.pp, else one stage per datacenter
        dp = job.dp if job.dp is not None else topology.total_gpus // (pp * tp)
        if dp < 1:
            raise InputError(f"pp {pp} x tp {tp} needs {pp * tp} GPUs, the topology has "
                             f"{topology.total_gpus}", topology.source, "job.pp")
        placement = file_order_placement(topology, dp, pp, tp)
        n = self.settings.connections

        def connections(a: str, b: str, kind: LinkKind) -> int:
            crosses_wan = topology.dc_of(a) != topology.dc_of(b)
            return n if kind is LinkKind.PIPELINE and crosses_wan else 1

        def plan_for(schedule: Schedule) -> Plan:
            return build_plan(self.name, topology, job, placement, schedule,
                              connections=connections)

        if self.settings.schedule != "auto":
            return plan_for(Schedule(self.settings.schedule))
        # simulate both schedules and keep the faster; 1F1B when neither can be simulated
        plans = [plan_for(Schedule.ONE_F_ONE_B), plan_for(Schedule.GPIPE)]
        seconds = [context.simulate(plan) for plan in plans]
        return min(zip(plans, seconds, strict=True),
                   key=lambda pair: math.inf if pair[1] is None else pair[1])[0]
