"""GPipe and 1F1B as commonly deployed: stages over DCs in file order, one TCP connection
per peer, fair WAN sharing (Varuna-style PP+DP)."""

from __future__ import annotations

from typing import ClassVar

from testbed.errors import InputError
from testbed.job import Job
from testbed.plan.build import assemble, default_pp, file_order_placement
from testbed.plan.model import Plan, Sharing
from testbed.policy.base import TrainingPolicy
from testbed.topology.model import Topology


class _FileOrderPipeline(TrainingPolicy):
    schedule: ClassVar[str]

    def plan(self, topology: Topology, job: Job) -> Plan:
        pp = default_pp(topology, job)
        dp = job.dp if job.dp is not None else topology.total_gpus // (pp * job.tp)
        if dp < 1:
            raise InputError(
                f"pp {pp} x tp {job.tp} needs {pp * job.tp} GPUs, the topology "
                f"has {topology.total_gpus}",
                topology.source,
                "job.pp",
            )
        placement = file_order_placement(topology, dp, pp, job.tp)
        return assemble(
            self.name,
            self.schedule,
            topology,
            job,
            placement,
            dp,
            pp,
            connections=lambda a, b, kind: 1,
            sharing=Sharing.FAIR,
        )


class GPipePolicy(_FileOrderPipeline):
    name = "gpipe"
    summary = "GPipe schedule, stages over DCs in file order, 1 TCP connection, fair sharing"
    schedule = "gpipe"


class OneFOneBPolicy(_FileOrderPipeline):
    name = "1f1b"
    summary = "1F1B schedule, stages over DCs in file order, 1 TCP connection, fair sharing"
    schedule = "1f1b"
