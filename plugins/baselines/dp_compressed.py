"""Every-step data parallelism across datacenters with compressed gradients: int8 or int4
(blockwise absmax integers) or top-k, each with error feedback (the part of a gradient a
member did not send is added to its next one: Seide et al. 2014, 1-bit SGD; Karimireddy
et al. 2019, "Error Feedback Fixes SignSGD", arXiv 1901.09847; for top-k, Stich et al.
2018, "Sparsified SGD with Memory", and Deep Gradient Compression, Lin et al. 2018, which
keeps 0.1%). Each member compresses once and every member gathers all members' payloads
(a ring all-gather, not an all-reduce: error feedback is correct only when a member's
own compression is the only error made). Placement as dp-across-dc."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.policy.api import (
    Collective,
    Job,
    Plan,
    PlanningContext,
    Topology,
    TrainingPolicy,
    payload,
    setting,
)

from .dp_across_dc import DataParallelSettings, data_parallel


@dataclass(frozen=True)
class CompressedSettings(DataParallelSettings):
    payload: str = setting("int8", "int8 or int4 (blockwise absmax), fp4 (E3M0), or topP% "
                           "(the largest P% of values with their indices; DGC keeps 0.1%)",
                           payload)


class DpCompressedPolicy(TrainingPolicy):
    name = "dp-compressed"
    summary = ("DP across DCs, gradients compressed (int8, int4 or top-k) with error feedback "
               "before every all-reduce")
    settings_type: ClassVar[type[Any]] = CompressedSettings
    settings: CompressedSettings

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        return data_parallel(self.name, topology, job,
                             Collective(payload=self.settings.payload), self.settings)
