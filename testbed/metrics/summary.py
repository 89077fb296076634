"""From a trace (timed spans per GPU, from either backend) to the numbers a run reports.

Spans are testbed.common.spans.Span: what each GPU did and when, on one clock in seconds; read
as rows (testbed.common.span_table), so the simulator's rows of a whole tensor-parallel group are
counted once per group, not once per GPU, with the same results.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypedDict

from testbed.common.span_table import rows
from testbed.common.spans import Span, SpanKind

TRAINING_KINDS: tuple[SpanKind, ...] = ("forward", "backward", "step", "outer_step")
BUSY_KINDS: tuple[SpanKind, ...] = (*TRAINING_KINDS, "prefill")
STEP_KINDS: tuple[SpanKind, ...] = ("step", "outer_step")
"""The spans `iteration_ends` reads."""


@dataclass(frozen=True)
class Epoch:
    """Iterations from `first` on ran on these GPUs, each of this many tokens: a run that
    went on with another plan after losing a worker (testbed.run.recovery) has several."""

    first: int
    gpus: tuple[str, ...]
    tokens_per_iteration: int


def _epoch_of(epochs: Sequence[Epoch], iteration: int) -> Epoch:
    return max((e for e in epochs if e.first <= iteration), key=lambda e: e.first,
               default=epochs[0])


def iteration_ends(spans: Iterable[Span], gpus: Sequence[str],
                   epochs: Sequence[Epoch] = (), first: int = 0) -> list[float]:
    """When each iteration finished: the last optimizer step over all GPUs, the outer
    step where the iteration has one (a DiLoCo sync belongs to the iteration that runs
    it). Only iterations every GPU stepped in count (every GPU of the iteration's epoch,
    where `epochs` are given), from iteration `first` on (a run's segment that went on
    from a checkpoint)."""
    stepped: dict[int, set[str]] = {}
    ends: dict[int, float] = {}
    for group, kind, _, end, iteration, _ in rows(spans):
        if kind in STEP_KINDS:
            if kind == "step":
                stepped.setdefault(iteration, set()).update(group)
            ends[iteration] = max(ends.get(iteration, end), end)
    out: list[float] = []
    for iteration in sorted(stepped):
        expected = set(_epoch_of(epochs, iteration).gpus if epochs else gpus)
        if iteration != first + len(out) or stepped[iteration] != expected:
            break
        out.append(ends[iteration])
    return out


def iteration_times(start: float, ends: Sequence[float]) -> list[float]:
    if not ends:
        return []
    previous = [start, *ends[:-1]]
    return [end - before for before, end in zip(previous, ends, strict=True)]


def counted_iterations(iterations: int, period: int = 1) -> range:
    """Which of a run's `iterations` completed ones its figures count: all but the first
    (connections warming up) when there are more than one. For a plan whose iterations
    differ (a cycle of `period`), whole cycles only, so a long sync is neither left out
    nor counted twice: the latest whole cycles after the first iteration (any `period`
    consecutive iterations run each program once), or the first cycle, first iteration
    included, when only that is whole; none before a cycle has completed."""
    if iterations < period:
        return range(0)
    whole = (iterations - 1) // period * period
    return range(iterations - whole, iterations) if whole else range(0, period)


def measured(times: Sequence[float], period: int = 1) -> list[float]:
    """The iteration times that count (`counted_iterations`)."""
    return [times[i] for i in counted_iterations(len(times), period)]


def window(start: float, ends: Sequence[float], period: int = 1) -> tuple[float, float]:
    """The time span the utilization figures cover, matching `measured`."""
    iterations = counted_iterations(len(ends), period)
    if not iterations:
        return start, start
    first, last = iterations[0], iterations[-1]
    return ends[first - 1] if first else start, ends[last]


def busy_time(spans: Iterable[Span], kinds: Sequence[SpanKind], lo: float, hi: float) -> float:
    """Total time inside [lo, hi] covered by spans of these kinds (overlaps per GPU merged)."""
    return busy_times(spans, (kinds,), lo, hi)[0]


def busy_times(spans: Iterable[Span], kind_sets: Sequence[Sequence[SpanKind]], lo: float,
               hi: float) -> list[float]:
    """`busy_time` for each set of kinds, in one pass over the spans."""
    per_group: list[dict[tuple[str, ...], list[tuple[float, float]]]] = [{} for _ in kind_sets]
    sets_of = {kind: [per_group[i] for i, kinds in enumerate(kind_sets) if kind in kinds]
               for kinds in kind_sets for kind in kinds}
    for group, kind, start, end, _, _ in rows(spans):
        into = sets_of.get(kind)
        if into:
            a = start if start >= lo else lo  # max and min, without their calls
            b = end if end <= hi else hi
            if b > a:
                for intervals in into:
                    intervals.setdefault(group, []).append((a, b))
    return [_busy(intervals) for intervals in per_group]


def _busy(per_group: dict[tuple[str, ...], list[tuple[float, float]]]) -> float:
    """A GPU's time is the union of its groups' intervals, worked out once for all GPUs
    that share the same groups, and summed GPU by GPU as if each had its own spans."""
    groups_of: dict[str, list[tuple[str, ...]]] = {}
    for group in per_group:
        for gpu in group:
            groups_of.setdefault(gpu, []).append(group)
    unions: dict[tuple[tuple[str, ...], ...], float] = {}
    total = 0.0
    for groups in groups_of.values():
        key = tuple(groups)
        if key not in unions:
            unions[key] = _union([i for group in groups for i in per_group[group]])
        total += unions[key]
    return total


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


def wan_bytes(spans: Iterable[Span], lo: float = float("-inf"), hi: float = float("inf")
              ) -> tuple[int, int]:
    """Bytes that crossed the WAN: in all, and arriving inside [lo, hi]."""
    total = inside = 0
    for group, kind, _, end, _, detail in rows(spans):
        if kind == "transfer" and detail.get("link"):
            moved = int(detail.get("bytes", 0)) * len(group)
            total += moved
            if lo <= end <= hi:
                inside += moved
    return total, inside


class IterationTimesBlock(TypedDict):
    median: float | None
    min: float | None
    max: float | None
    mean: float | None
    all: list[float]


class CycleTimesBlock(TypedDict):
    mean: float | None
    period: int
    cycles: int


class TokensBlock(TypedDict):
    measured: int
    total: int
    measured_s: float | None


class UtilizationBlock(TypedDict):
    training: float | None
    total: float | None


class WanBlock(TypedDict):
    bytes: int
    utilization: float | None


class SummaryResults(TypedDict):
    """A summary's keys of results.json (testbed.report.run_results' Results reads them)."""

    iteration_time_s: IterationTimesBlock
    cycle_time_s: CycleTimesBlock
    tokens_per_s: float | None
    goodput_tokens_per_s: float | None
    tokens: TokensBlock
    gpu_utilization: UtilizationBlock
    wan: WanBlock


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
    mean_s: float | None = None
    """Of the counted iterations: for a plan whose iterations differ, the figure that
    describes it (the median of a cycle with one long sync is an iteration without it)."""
    period: int = 1
    """Iterations in the plan's cycle (Plan.period)."""
    cycles: int = 0
    """Whole cycles counted."""
    iteration_tokens: tuple[int, ...] = ()
    """Tokens of each completed iteration, where they differ (a run replanned after a
    failure); empty: `tokens_per_iteration` each."""

    def tokens_of(self, iterations: Iterable[int]) -> int:
        """Tokens of these completed iterations."""
        if not self.iteration_tokens:
            return self.tokens_per_iteration * len(list(iterations))
        return sum(self.iteration_tokens[i] for i in iterations)

    @property
    def goodput_tokens_per_s(self) -> float | None:
        """Tokens of every completed iteration over the time from the start of training
        to the end of the last: the first iteration, failures and recoveries included."""
        ends = self.iteration_ends_s
        return throughput(self.tokens_total, 0.0, ends[-1]) if ends else None

    @property
    def typical_s(self) -> float | None:
        """The iteration time that describes the run: the median, or for a plan whose
        iterations differ the mean over whole cycles."""
        return self.mean_s if self.period > 1 else self.median_s

    @property
    def cycle_s(self) -> float | None:
        """The mean time of one whole cycle."""
        return None if self.mean_s is None else self.mean_s * self.period

    @property
    def iteration_ends_s(self) -> list[float]:
        """When each completed iteration ended, in seconds since the run's start."""
        return list(itertools.accumulate(self.iteration_times))

    @property
    def tokens_total(self) -> int:
        """Tokens of every completed iteration, the first included."""
        return self.tokens_of(range(len(self.iteration_times)))

    @property
    def tokens_measured(self) -> int:
        """Tokens of the iterations `tokens_per_s` counts."""
        return self.tokens_of(counted_iterations(len(self.iteration_times), self.period))

    def as_results(self) -> SummaryResults:
        return {
            "iteration_time_s": {
                "median": self.median_s,
                "min": self.min_s,
                "max": self.max_s,
                "mean": self.mean_s,
                "all": self.iteration_times,
            },
            "cycle_time_s": {"mean": self.cycle_s, "period": self.period,
                             "cycles": self.cycles},
            "tokens_per_s": self.tokens_per_s,
            "goodput_tokens_per_s": self.goodput_tokens_per_s,
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


def typical_iteration_s(times: Sequence[float], period: int = 1) -> float | None:
    """What one iteration takes, from the counted ones (`measured`): their median, or for
    a plan whose iterations differ, their mean over whole cycles."""
    kept = measured(times, period)
    if not kept:
        return None
    return statistics.median(kept) if period == 1 else statistics.fmean(kept)


def run_iteration_s(spans: Sequence[Span], gpus: Sequence[str], start: float,
                    period: int = 1) -> float | None:
    """The typical iteration alone (`typical_iteration_s`: the median, the mean over whole
    cycles for a cycle), exactly as `summarize` has it: what a planner compares
    candidates by, without the utilization it would not read."""
    return typical_iteration_s(iteration_times(start, iteration_ends(spans, gpus)), period)


def summarize(
    spans: Sequence[Span],
    gpus: Sequence[str],
    start: float,
    tokens_per_iteration: int,
    wan_capacity_bps: float,
    period: int = 1,
    epochs: Sequence[Epoch] = (),
) -> Summary:
    """`period`: the plan's (Plan.period); a plan whose iterations differ is judged over
    whole cycles (`counted_iterations`). `epochs`: where a run changed plans, the GPUs
    and tokens of each iteration (`gpus`, all of them, is what utilization counts)."""
    ends = iteration_ends(spans, gpus, epochs)
    times = iteration_times(start, ends)
    counted_times = measured(times, period)
    lo, hi = window(start, ends, period)
    length = hi - lo
    tokens = tuple(_epoch_of(epochs, i).tokens_per_iteration for i in range(len(ends))) \
        if len({e.tokens_per_iteration for e in epochs}) > 1 else ()
    tokens_measured = sum(tokens[i] for i in counted_iterations(len(ends), period)) \
        if tokens else tokens_per_iteration * len(counted_times)
    median = statistics.median(counted_times) if counted_times else None
    mean = statistics.fmean(counted_times) if counted_times else None
    training = total = wan_util = None
    wan_total, wan_inside = wan_bytes(spans, lo, hi)
    if length > 0 and gpus:
        capacity = length * len(gpus)
        busy_training, busy_total = busy_times(spans, (TRAINING_KINDS, BUSY_KINDS), lo, hi)
        training, total = busy_training / capacity, busy_total / capacity
        if wan_capacity_bps > 0:
            wan_util = wan_inside * 8 / (wan_capacity_bps * length)
    return Summary(
        iteration_times=times,
        median_s=median,
        min_s=min(counted_times) if counted_times else None,
        max_s=max(counted_times) if counted_times else None,
        tokens_per_s=throughput(tokens_measured, lo, hi),
        tokens_per_iteration=tokens_per_iteration,
        measured_s=length if ends else None,
        utilization_training=training,
        utilization_total=total,
        wan_bytes=wan_total,
        wan_utilization=wan_util,
        mean_s=mean,
        period=period,
        cycles=len(counted_times) // period,
        iteration_tokens=tokens,
    )
