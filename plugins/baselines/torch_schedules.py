"""torch's pipeline schedules for several stages per GPU, placed as the `gpipe` and `1f1b`
baselines place (GPUs in file order, one TCP connection per peer, fair WAN sharing), each
GPU holding the stages torch's stage-to-rank mapping gives it. The order of every GPU's
compute is the one torch 2.13's own schedule class computes; its communication is what
torch's runtime for lowered schedules issues (sends right after their compute, waited
for at the end of the step; `-o sends=eager` never waits).

`--pp` (the job's `pp`) stays the number of GPUs in a pipeline; `virtual` multiplies the
stages (ZB-V and DualPipeV hold exactly two per GPU, V-shaped)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.policy.api import Schedule, at_least_one, setting

from .pipeline import FileOrderPipeline, PipelineSettings


@dataclass(frozen=True)
class VirtualSettings(PipelineSettings):
    virtual: int = setting(2, "stages per GPU (GPU g of P holds stages g, g + P, ...)",
                           at_least_one)


class VirtualStages(FileOrderPipeline):
    """Several stages per GPU: `virtual` of them."""

    settings_type: ClassVar[type[Any]] = VirtualSettings
    settings: VirtualSettings

    def virtual(self) -> int:
        return self.settings.virtual


class Interleaved1F1BPolicy(VirtualStages):
    name = "interleaved-1f1b"
    summary = ("torch's ScheduleInterleaved1F1B (Megatron's interleaved 1F1B), `virtual` "
               "stages per GPU, stages over DCs in file order")
    schedule = Schedule.INTERLEAVED_1F1B


class LoopedBFSPolicy(VirtualStages):
    name = "looped-bfs"
    summary = ("torch's ScheduleLoopedBFS (breadth-first: every microbatch through a GPU's "
               "earlier stage first), `virtual` stages per GPU")
    schedule = Schedule.LOOPED_BFS


class InterleavedZeroBubblePolicy(VirtualStages):
    name = "interleaved-zb"
    summary = ("torch's ScheduleInterleavedZeroBubble (ZB1P: backward split into I and W, "
               "W fills bubbles), `virtual` stages per GPU")
    schedule = Schedule.INTERLEAVED_ZB


class ZeroBubbleVPolicy(VirtualStages):
    name = "zb-v"
    summary = "torch's ScheduleZBVZeroBubble (ZB-V: two stages per GPU in a V, I and W split)"
    schedule = Schedule.ZB_V
    fixed = {"virtual": 2}


class DualPipeVPolicy(VirtualStages):
    name = "dualpipe-v"
    summary = ("torch's ScheduleDualPipeV (DeepSeek's DualPipe in a V: overlapped forward "
               "and backward, two stages per GPU)")
    schedule = Schedule.DUALPIPE_V
    fixed = {"virtual": 2}
