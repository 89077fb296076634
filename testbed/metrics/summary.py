"""From a trace (timed spans per GPU, from either backend) to the numbers a run reports.

Spans are testbed.spans.Span: what each GPU did and when, on one clock in seconds.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from testbed.spans import Span, SpanKind

TRAINING_KINDS: tuple[SpanKind, ...] = ("forward", "backward", "step")
BUSY_KINDS: tuple[SpanKind, ...] = (*TRAINING_KINDS, "prefill")


def iteration_ends(spans: Iterable[Span], gpus: Sequence[str]) -> list[float]:
    """When each iteration finished: the last optimizer step over all GPUs. Only iterations
    every GPU completed count."""
    ends: dict[int, dict[str, float]] = {}
    for span in spans:
        if span["kind"] == "step":
            ends.setdefault(span["iteration"], {})[span["gpu"]] = span["end"]
    out: list[float] = []
    for iteration in sorted(ends):
        if iteration != len(out) or set(ends[iteration]) != set(gpus):
            break
        out.append(max(ends[iteration].values()))
    return out


def iteration_times(start: float, ends: Sequence[float]) -> list[float]:
    if not ends:
        return []
    previous = [start, *ends[:-1]]
    return [end - before for before, end in zip(previous, ends, strict=True)]


def measured(times: Sequence[float]) -> list[float]:
    """Iterations that count: all but the first (connections warming up) when there are
    more than one."""
    return list(times[1:]) if len(times) > 1 else list(times)


def window(start: float, ends: Sequence[float]) -> tuple[float, float]:
    """The time span the utilization figures cover, matching `measured`."""
    if len(ends) > 1:
        return ends[0], ends[-1]
    return start, ends[0] if ends else start


def busy_time(spans: Iterable[Span], kinds: Sequence[SpanKind], lo: float, hi: float) -> float:
    """Total time inside [lo, hi] covered by spans of these kinds (overlaps per GPU merged)."""
    per_gpu: dict[str, list[tuple[float, float]]] = {}
    for span in spans:
        if span["kind"] in kinds:
            a, b = max(span["start"], lo), min(span["end"], hi)
            if b > a:
                per_gpu.setdefault(span["gpu"], []).append((a, b))
    return sum(_union(intervals) for intervals in per_gpu.values())


def _union(intervals: list[tuple[float, float]]) -> float:
    total, current_start, current_end = 0.0, None, None
    for a, b in sorted(intervals):
        if current_end is None or a > current_end:
            if current_end is not None and current_start is not None:
                total += current_end - current_start
            current_start, current_end = a, b
        else:
            current_end = max(current_end, b)
    if current_end is not None and current_start is not None:
        total += current_end - current_start
    return total


def wan_bytes(spans: Iterable[Span], lo: float = float("-inf"), hi: float = float("inf")) -> int:
    return sum(
        int(s.get("bytes", 0))
        for s in spans
        if s["kind"] == "transfer" and s.get("link") and lo <= s["end"] <= hi
    )


@dataclass(frozen=True)
class Summary:
    iteration_times: list[float]
    median_s: float | None
    min_s: float | None
    max_s: float | None
    tokens_per_s: float | None
    """Tokens of the measured iterations over the time they took (`throughput`)."""
    tokens_per_iteration: int
    measured_s: float | None
    """The time the measured iterations took: the end of the first (uncounted) iteration
    to the end of the last, or the run's start to the end of its only one."""
    utilization_training: float | None
    utilization_total: float | None
    wan_bytes: int
    wan_utilization: float | None

    @property
    def iteration_ends_s(self) -> list[float]:
        """When each completed iteration ended, in seconds since the run's start."""
        return list(itertools.accumulate(self.iteration_times))

    @property
    def tokens_total(self) -> int:
        """Tokens of every completed iteration, the first included."""
        return self.tokens_per_iteration * len(self.iteration_times)

    @property
    def tokens_measured(self) -> int:
        """Tokens of the iterations `tokens_per_s` counts."""
        return self.tokens_per_iteration * len(measured(self.iteration_times))

    def as_results(self) -> dict[str, Any]:
        return {
            "iteration_time_s": {
                "median": self.median_s,
                "min": self.min_s,
                "max": self.max_s,
                "all": self.iteration_times,
            },
            "tokens_per_s": self.tokens_per_s,
            "tokens": {"measured": self.tokens_measured, "total": self.tokens_total,
                       "measured_s": self.measured_s},
            "gpu_utilization": {
                "training": self.utilization_training,
                "total": self.utilization_total,
            },
            "wan": {"bytes": self.wan_bytes, "utilization": self.wan_utilization},
        }


def throughput(tokens: int, lo: float, hi: float) -> float | None:
    """Tokens per second over a window: total tokens over total time, never a typical
    iteration's, so a run whose iterations differ in length (a sync every H steps) is
    measured by what it processed."""
    return tokens / (hi - lo) if tokens and hi > lo else None


def speedup(tokens_per_s: float | None, baseline: float | None) -> float | None:
    """How many times the baseline's throughput: the one yardstick runs are compared by
    (a ratio of iteration times would charge a policy for doing more per iteration)."""
    return tokens_per_s / baseline if tokens_per_s and baseline else None


def median_at_least(start: float, ends: Sequence[float], iterations: int, now: float
                    ) -> float:
    """A lower bound on the median measured iteration of a run of `iterations` that has
    finished `ends` by `now`: the iteration under way lasts at least until now, the ones
    after it at least nothing (the median grows with each of them). 0 while only
    uncounted iterations have run."""
    times = iteration_times(start, ends)
    if len(ends) >= iterations:
        return statistics.median(measured(times))
    if iterations > 1 and not ends:
        return 0.0  # the first iteration does not count
    counted = (times[1:] if iterations > 1 else times)
    counted.append(now - (ends[-1] if ends else start))
    counted += [0.0] * (iterations - len(ends) - 1)
    return statistics.median(counted)


def slower_after(start: float, ends: Sequence[float], iterations: int, limit: float
                 ) -> float:
    """The earliest time by which a run still short of its last iteration shows its median
    measured iteration longer than `limit` (`median_at_least` above it); inf when no time
    can show it before the next iteration ends."""
    last = ends[-1] if ends else start
    far = last + 4 * iterations * (limit + max(iteration_times(start, ends), default=0.0))
    if median_at_least(start, ends, iterations, far) <= limit:
        return float("inf")
    low, high = last, far
    for _ in range(200):
        middle = (low + high) / 2
        if middle in (low, high):
            break
        if median_at_least(start, ends, iterations, middle) > limit:
            high = middle
        else:
            low = middle
    return high


def median_iteration_s(spans: Sequence[Span], gpus: Sequence[str], start: float
                       ) -> float | None:
    """The median of the measured iterations alone, exactly as `summarize` has it: what a
    planner compares candidates by, without the utilization it would not read."""
    counted = measured(iteration_times(start, iteration_ends(spans, gpus)))
    return statistics.median(counted) if counted else None


def summarize(
    spans: Sequence[Span],
    gpus: Sequence[str],
    start: float,
    tokens_per_iteration: int,
    wan_capacity_bps: float,
) -> Summary:
    ends = iteration_ends(spans, gpus)
    times = iteration_times(start, ends)
    counted = measured(times)
    lo, hi = window(start, ends)
    length = hi - lo
    tokens_measured = tokens_per_iteration * len(counted)
    median = statistics.median(counted) if counted else None
    training = total = wan_util = None
    if length > 0 and gpus:
        capacity = length * len(gpus)
        training = busy_time(spans, TRAINING_KINDS, lo, hi) / capacity
        total = busy_time(spans, BUSY_KINDS, lo, hi) / capacity
        if wan_capacity_bps > 0:
            wan_util = wan_bytes(spans, lo, hi) * 8 / (wan_capacity_bps * length)
    return Summary(
        iteration_times=times,
        median_s=median,
        min_s=min(counted) if counted else None,
        max_s=max(counted) if counted else None,
        tokens_per_s=throughput(tokens_measured, lo, hi),
        tokens_per_iteration=tokens_per_iteration,
        measured_s=length if ends else None,
        utilization_training=training,
        utilization_total=total,
        wan_bytes=wan_bytes(spans),
        wan_utilization=wan_util,
    )
