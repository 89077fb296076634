"""GPipe and 1F1B as commonly deployed: stages over DCs in file order, one TCP connection
per peer, fair WAN sharing (Varuna-style PP+DP), waiting on sends as torch's
ScheduleGPipe and Schedule1F1B do (`-o sends=eager` never waits on a send, for
comparison). torch's schedules for several stages per GPU place the same way
(testbed_plugins.baselines.torch_schedules)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.policy.api import (
    InputError,
    Job,
    Plan,
    PlanningContext,
    Schedule,
    Sends,
    Topology,
    TrainingPolicy,
    build_plan,
    default_pp,
    file_order_placement,
    one_of,
    setting,
    virtual_placement,
)


@dataclass(frozen=True)
class PipelineSettings:
    sends: Sends = setting(Sends.TORCH, "torch: wait on sends as torch's schedule does; "
                           "eager: never wait on a send", lambda raw: Sends(one_of(*Sends)(raw)))


class FileOrderPipeline(TrainingPolicy):
    """A pipeline of `pp` GPUs (the job's, or one per DC) over the topology's GPUs in file
    order, replicas side by side; each GPU holds `virtual()` stages as torch's mapping
    for the schedule puts them."""

    schedule: ClassVar[Schedule]
    settings_type: ClassVar[type[Any]] = PipelineSettings
    settings: PipelineSettings

    def virtual(self) -> int:
        """Stages per GPU: one (torch's schedules for several have it as a setting)."""
        return 1

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        pp = default_pp(topology, job)
        dp = job.dp if job.dp is not None else topology.total_gpus // (pp * job.tp)
        if dp < 1:
            raise InputError(
                f"pp {pp} x tp {job.tp} needs {pp * job.tp} GPUs, the topology "
                f"has {topology.total_gpus}",
                topology.source,
                "job.pp",
            )
        ranks = file_order_placement(topology, dp, pp, job.tp)
        placement = virtual_placement(ranks, self.schedule, self.virtual())
        return build_plan(self.name, topology, job, placement, self.schedule,
                          sends=self.settings.sends)


class GPipePolicy(FileOrderPipeline):
    name = "gpipe"
    summary = "GPipe schedule, stages over DCs in file order, 1 TCP connection, fair sharing"
    schedule = Schedule.GPIPE


class OneFOneBPolicy(FileOrderPipeline):
    name = "1f1b"
    summary = "1F1B schedule, stages over DCs in file order, 1 TCP connection, fair sharing"
    schedule = Schedule.ONE_F_ONE_B
