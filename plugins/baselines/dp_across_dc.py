"""Data parallelism across datacenters: whole pipelines inside each DC, gradients all-reduced
over the WAN. The usual way to span DCs, and the one the WAN hurts most. Gradients reduce
in buckets as torch's DistributedDataParallel reduces them (`bucket_mb`, its 25 MiB by
default), each starting as the backward has its values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.policy.api import (
    DDP_BUCKET_MB,
    Collective,
    Job,
    Plan,
    PlanningContext,
    Schedule,
    SyncOrder,
    Topology,
    TrainingPolicy,
    bucket_size,
    build_plan,
    dc_pipelines,
    one_of,
    setting,
)

BUCKET_HELP = ("bucket size in MiB: each bucket's all-reduce starts as the backward has its "
               "values (torch DDP's default 25); 0: one all-reduce after the backward")
ORDER_HELP = ("how all-reduces crossing the WAN share it: fair (every flow at once) or "
              "first-layers (one transfer at a time, the first layers' first)")


@dataclass(frozen=True)
class DataParallelSettings:
    bucket_mb: float = setting(DDP_BUCKET_MB, BUCKET_HELP, bucket_size)
    sync_order: str = setting("fair", ORDER_HELP, one_of("fair", "first-layers"))


def data_parallel(name: str, topology: Topology, job: Job, gradients: Collective,
                  settings: DataParallelSettings) -> Plan:
    """Every whole pipeline that fits a datacenter, gradients reduced across all of them
    every step (the placement's replicas are the plan's dp)."""
    return build_plan(name, topology, job, dc_pipelines(topology, job), Schedule.ONE_F_ONE_B,
                      gradients=gradients, bucket_mb=settings.bucket_mb or None,
                      sync_order=SyncOrder(settings.sync_order))


class DpAcrossDcPolicy(TrainingPolicy):
    name = "dp-across-dc"
    summary = "1F1B pipelines kept inside each DC, gradient all-reduce across DCs over the WAN"
    settings_type: ClassVar[type[Any]] = DataParallelSettings
    settings: DataParallelSettings

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        return data_parallel(self.name, topology, job, Collective(), self.settings)
