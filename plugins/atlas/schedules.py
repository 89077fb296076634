"""The schedules Atlas tries on a placement: GPipe, 1F1B with more warm-up forwards
(uniform, or per WAN crossing downstream), and torch's orders over two stages per GPU
where they fit. Pure."""

from __future__ import annotations

from dataclasses import replace

from testbed.policy.api import (
    Job,
    Schedule,
    Topology,
    Worker,
    fits_memory,
    virtual_placement,
)

from .placement import Chain, place
from .search import Candidate

PER_CROSSING = (1, 2, 3, 4)
"""Extra warm-up forwards per WAN crossing downstream that the search tries."""
TWO_PER_GPU = (Schedule.INTERLEAVED_1F1B, Schedule.INTERLEAVED_ZB, Schedule.ZB_V)
"""torch's schedules over two stages per GPU the search tries (where they fit): smaller
compute bubbles, and twice the chain's WAN crossings per microbatch."""


def one_per_gpu(m: int, dcs: int) -> list[tuple[Schedule, int, bool]]:
    """(schedule, extra warm-up, per crossing) to try: 1F1B with uniform warm-ups, with
    warm-ups per downstream WAN crossing (when the chain crosses the WAN), and GPipe."""
    out = [(Schedule.ONE_F_ONE_B, extra, False) for extra in sorted({0, 2, 4, 8, 16, m})
           if extra <= m]
    if dcs > 1:
        out += [(Schedule.ONE_F_ONE_B, k, True) for k in PER_CROSSING if k <= m]
    return [*out, (Schedule.GPIPE, 0, False)]


def two_per_gpu(topology: Topology, job: Job, base: Candidate) -> list[Candidate]:
    """torch's orders over two stages per GPU of `base`'s placement (TWO_PER_GPU), each
    where the model has a layer per stage, torch takes the microbatches, and it fits in
    memory; estimated as `base` (the closed form has no term for them)."""
    if not two_fit(job, base.pp):
        return []
    out = []
    for kind in TWO_PER_GPU:
        if fits_memory(topology, job, placed(topology, job, base.chain, base.dp, kind, 2),
                       kind):  # False too where torch refuses the microbatches
            out.append(replace(base, schedule_kind=kind, extra_warmup=0, per_crossing=False,
                               virtual=2, simulated_s=None, at_least=False))
    return out


def two_fit(job: Job, pp: int) -> bool:
    """Whether the model has a layer for each of two stages per GPU of `pp`."""
    return 2 * pp <= job.model.layers


def placed(topology: Topology, job: Job, chain: Chain, dp: int, schedule: Schedule,
           virtual: int) -> dict[Worker, tuple[str, ...]]:
    """The chain's GPUs in pipeline order, each holding `virtual` stages as torch maps
    them under `schedule`."""
    return virtual_placement(place(topology, chain, dp, job.tp), schedule, virtual)
