"""How many of a run's WAN transfers ran in step with another's: each one that shared its
link with another transfer, and of those, each that started and ended with one of them to
the float. The simulator's equal shares keep such transfers together (the
replicas of a fair-shared plan above all), where real TCP's unequal moment-to-moment
shares drift them apart and can change the schedule (paper-3dc's 1F1B: 27.5 s simulated
against 22.6 s emulated). Read from spans alone, so both backends count alike: a row of
the simulator's span table (a tensor-parallel group's one transfer) counts once."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from typing import TypedDict

from testbed.common.span_table import rows
from testbed.common.spans import Span


class LockstepCounts(TypedDict):
    """results.json's `lockstep` (a simulated run's)."""

    contended: int
    """WAN transfers whose time on their link overlapped another transfer there."""
    in_step: int
    """Of those, the ones that started and ended exactly when another did on the link."""


def lockstep(spans: Iterable[Span]) -> LockstepCounts:
    by_link: defaultdict[str, list[tuple[float, float]]] = defaultdict(list)
    for _gpus, kind, start, end, _iteration, detail in rows(spans):
        if kind != "transfer":  # most rows: a hot loop at paper scale
            continue
        link = detail.get("link")
        if link and end > start:
            by_link[link].append((start, end))
    contended = in_step = 0
    for transfers in by_link.values():
        transfers.sort()
        twins = Counter(transfers)
        latest = float("-inf")  # the latest end of the transfers started before
        for i, (start, end) in enumerate(transfers):
            after = i + 1 < len(transfers) and transfers[i + 1][0] < end
            if latest > start or after:
                contended += 1
                in_step += twins[(start, end)] > 1
            latest = max(latest, end)
    return {"contended": contended, "in_step": in_step}
