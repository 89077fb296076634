"""How often a prefill outlasted the bubble it was started in, and by how much: the time
training waited for inference. Read from spans alone, so both backends count alike: a
bubble ends when the awaited data arrived (a receive's start plus what it `waited`); a
prefill that ends later held the GPU past it."""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypedDict

from testbed.common.spans import Span, is_wait
from testbed.common.stats import percentile


class OverrunCounts(TypedDict):
    """The `overruns` of results.json's `inference` block (Overruns, and its fraction)."""

    prefills: int
    overran: int
    mean_s: float | None
    p99_s: float | None
    max_s: float | None
    fraction: float | None
    """Of the prefills, those that overran."""


@dataclass(frozen=True)
class Overruns:
    prefills: int
    """Prefills started inside a receive's or an all-reduce's wait
    (testbed.common.spans.is_wait)."""
    overran: int
    mean_s: float | None
    """Of the overruns."""
    p99_s: float | None
    max_s: float | None

    def as_dict(self) -> OverrunCounts:
        return {"prefills": self.prefills, "overran": self.overran, "mean_s": self.mean_s,
                "p99_s": self.p99_s, "max_s": self.max_s,
                "fraction": self.overran / self.prefills if self.prefills else None}


def prefill_overruns(spans: Iterable[Span]) -> Overruns:
    waits: dict[str, list[tuple[float, float]]] = {}
    prefills: list[Span] = []
    for span in spans:
        if is_wait(span) and span["end"] > span["start"]:
            waited = span.get("waited", span["end"] - span["start"])
            waits.setdefault(span["gpu"], []).append((span["start"], span["start"] + waited))
        elif span["kind"] == "prefill":
            prefills.append(span)
    for bubbles in waits.values():
        bubbles.sort()
    counted, late = 0, []
    for span in prefills:
        bubbles = waits.get(span["gpu"], [])
        i = bisect.bisect_right(bubbles, (span["start"], float("inf"))) - 1
        if i < 0:
            continue
        begun, arrived = bubbles[i]
        if not begun <= span["start"] <= max(arrived, begun):
            continue
        counted += 1
        if span["end"] > arrived + 1e-9:
            late.append(span["end"] - arrived)
    return Overruns(counted, len(late), sum(late) / len(late) if late else None,
                    percentile(late, 0.99), max(late, default=None))
