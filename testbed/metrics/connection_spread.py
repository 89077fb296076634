"""How much some connections stay slower than others, run-long: the part of the WAN
transfers' spread that follows the connection, not the message. Replicas of a fair-shared
plan send the same step over one link at about the same time; in real TCP each
connection keeps its own slow-start threshold from its earlier losses (a restart after an
idle resets the window, not the threshold), so the same connections come out slow step
after step and the replicas drift apart for good. Read from spans alone, so both
backends measure alike (testbed.plan.tcp_model.THRESHOLD_CV is fitted to it)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable

from testbed.common.span_table import rows
from testbed.common.spans import Span

Step = tuple[str, int, object, object]
"""(link, iteration, receiving stage, microbatch): one step of every replica on a link."""


def connection_spread(spans: Iterable[Span]) -> float | None:
    """The standard deviation of the connections' lasting effects on their transfers'
    durations (natural log, so about a fraction): each WAN transfer's log duration less
    the mean of its step's (the same step of the other replicas over the same link), a
    connection's effect the mean of its transfers', their variance less what the
    transfers' own scatter leaves in such a mean (within-connection variance over the
    transfers per connection), 0 where that is all. The first iteration, whose
    connections start afresh, is left out. None where fewer than two connections have
    two such transfers each."""
    steps: defaultdict[Step, list[tuple[str, float]]] = defaultdict(list)
    for _gpus, kind, start, end, iteration, detail in rows(spans):
        if kind != "transfer" or iteration < 1 or end <= start:
            continue
        link = detail.get("link")
        if link:
            step = (link, iteration, detail.get("stage"), detail.get("microbatch"))
            steps[step].append((f"{detail.get('src')}>{detail.get('dst')}",
                                math.log(end - start)))
    effects: defaultdict[str, list[float]] = defaultdict(list)
    for transfers in steps.values():
        if len(transfers) < 2:
            continue
        mean = statistics.fmean(duration for _, duration in transfers)
        for connection, duration in transfers:
            effects[connection].append(duration - mean)
    kept = [each for each in effects.values() if len(each) >= 2]
    if len(kept) < 2:
        return None
    within = statistics.fmean(statistics.variance(each) for each in kept)
    per_connection = statistics.fmean(len(each) for each in kept)
    between = statistics.variance([statistics.fmean(each) for each in kept])
    return math.sqrt(max(0.0, between - within / per_connection))
