"""Local SGD: whole replicas in each datacenter take `every` steps on their own, then
average their parameters across datacenters (Stich, "Local SGD Converges Fast and
Communicates Little", 2019). A plan that spans iterations: a cycle of `every` programs,
the last one ending in a sync of parameter deltas."""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.policy.api import (
    Action,
    Collective,
    Job,
    Op,
    OuterOptimizer,
    Plan,
    PlanningContext,
    Reduces,
    Schedule,
    Topology,
    TrainingPolicy,
    at_least_one,
    build_plan,
    cycled,
    dc_pipelines,
    setting,
)


@dataclass(frozen=True)
class LocalSgdSettings:
    every: int = setting(8, "steps between averages", at_least_one)


class LocalSgd(TrainingPolicy):
    name = "local-sgd"  # must equal the entry-point name
    summary = "replicas per DC step on their own, then average parameters every N steps"
    api_version = 2
    settings_type: ClassVar[type[Any]] = LocalSgdSettings
    settings: LocalSgdSettings

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        # whole pipelines inside datacenters; no gradient all-reduce: replicas step apart
        inner = build_plan(self.name, topology, job, dc_pipelines(topology, job),
                           Schedule.ONE_F_ONE_B, gradients=None)

        def alone(stage: int) -> Sequence[Action]:
            return ()

        def average(stage: int) -> Sequence[Action]:
            # the deltas since the last average, summed and divided by the replicas;
            # an outer step of learning rate 1 without momentum applies the average
            deltas = Collective(Reduces.DELTAS)
            return (Action(stage, Op.ALLREDUCE, None, deltas), Action(stage, Op.OUTER_STEP))

        every = self.settings.every
        return cycled(inner, [*([alone] * (every - 1)), average],
                      OuterOptimizer(lr=1.0, momentum=0.0, nesterov=False))
