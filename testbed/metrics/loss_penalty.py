"""What real compute measures against the loss model: a method's loss per token over
every-step data parallelism's, defined as the model defines its penalty
(testbed.loss.model.Penalty: the method's loss over data parallelism's at the same
tokens), and whether the methods fall in the model's order by it. Pure: curves in,
figures out.

The loss compared at a step is that of the model the run keeps there, on that step's
global batch before anything has trained on it: the step's training loss for an
every-step method, the synchronized model's for the DiLoCo family (testbed.metrics.loss.
synced_loss_curve, kept once a cycle). One batch's loss is noisy, so the penalty is the
mean of the method's losses at its evaluation points in the budget's last part over the
mean of data parallelism's at the same steps: the same batches, after the same tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import mean
from typing import TypedDict

from testbed.metrics.loss import LossPoint

WINDOW = 0.25
"""The share of the budget, at its end, whose evaluation points the penalty averages."""


def penalty_steps(iterations: int, share: float = WINDOW) -> tuple[int, int]:
    """The steps [first, end) whose losses the penalty averages: the last `share` of a
    budget of `iterations` steps (one step at least)."""
    if iterations < 1 or not 0 < share <= 1:
        raise ValueError(f"a budget of {iterations} steps and a share of {share}: need at "
                         "least one step and a share in (0, 1]")
    return iterations - max(1, round(iterations * share)), iterations


def measured_penalty(curve: Sequence[LossPoint], baseline: Sequence[LossPoint],
                     steps: tuple[int, int]) -> float | None:
    """The method's loss per token over the baseline's: the mean of `curve`'s losses in
    `steps` over the mean of `baseline`'s at the same steps. None where either diverged
    there (a loss of None or NaN); ValueError where the method has no point in `steps`, or the
    baseline lacks one of its steps or processed other tokens by it."""
    first, end = steps
    mine = {p["iteration"]: p for p in curve if first <= p["iteration"] < end}
    base = {p["iteration"]: p for p in baseline}
    if not mine:
        raise ValueError(f"no evaluation point in steps {first}-{end - 1}")
    missing = sorted(set(mine) - set(base))
    if missing:
        raise ValueError(f"the baseline has no loss at step(s) {missing}")
    other = [i for i in sorted(mine) if mine[i]["tokens"] != base[i]["tokens"]]
    if other:
        raise ValueError(f"at step(s) {other} the baseline had processed other tokens")
    ours = [mine[i]["loss"] for i in sorted(mine)]
    theirs = [base[i]["loss"] for i in sorted(mine)]
    if any(v is None or not math.isfinite(v) for v in (*ours, *theirs)):
        return None
    return mean(v for v in ours if v is not None) / mean(v for v in theirs if v is not None)


class PairOrder(TypedDict):
    """Two methods the model orders: whether the measured penalties do too."""

    lower: str
    """The method the model gives the lower loss per token."""
    higher: str
    holds: bool
    """Whether the mean measured penalty of `lower` is below that of `higher`."""
    every_seed: bool
    """Whether every seed orders the two as their means do."""


class TiedPair(TypedDict):
    """Two methods the model ties (exact methods: one curve by construction)."""

    methods: list[str]
    largest_gap: float | None
    """The largest difference of their measured penalties at one seed (None: one of
    them diverged)."""


class Ordering(TypedDict):
    """The methods in the model's order and in the measured one, pair by pair."""

    predicted: list[str]
    """Lowest predicted penalty first."""
    measured: list[str]
    """Lowest mean measured penalty first (a method that diverged at a seed left out)."""
    pairs: list[PairOrder]
    ties: list[TiedPair]
    holds: bool
    """Whether every pair the model orders is in that order by the measured means."""


def seed_mean(values: Sequence[float | None]) -> float | None:
    """The mean over seeds; None where a seed diverged (or there are none)."""
    if not values or any(v is None for v in values):
        return None
    return mean(v for v in values if v is not None)


def ordering(predicted: Mapping[str, float],
             by_seed: Mapping[str, Sequence[float | None]]) -> Ordering:
    """Whether the methods' order by measured penalty (`by_seed`: each method's at each
    seed, the seeds in one order) is the `predicted` one: every pair whose predicted
    penalties differ, by the means over seeds. Pairs the model ties are not ordered; their
    gap is reported."""
    means = {label: seed_mean(by_seed[label]) for label in predicted}
    labels = list(predicted)
    pairs: list[PairOrder] = []
    ties: list[TiedPair] = []
    for i, a in enumerate(labels):
        for b in labels[i + 1:]:
            seeds = list(zip(by_seed[a], by_seed[b], strict=True))
            if predicted[a] == predicted[b]:
                gaps = [None if x is None or y is None else abs(x - y) for x, y in seeds]
                ties.append(TiedPair(methods=[a, b], largest_gap=None if None in gaps else
                                     max((g for g in gaps if g is not None), default=0.0)))
                continue
            low, high = (a, b) if predicted[a] < predicted[b] else (b, a)
            ml, mh = means[low], means[high]
            holds = ml is not None and mh is not None and ml < mh
            if low != a:
                seeds = [(y, x) for x, y in seeds]
            every = all(x is not None and y is not None and (x < y) == holds
                        for x, y in seeds)
            pairs.append(PairOrder(lower=low, higher=high, holds=holds, every_seed=every))
    done = {label: value for label, value in means.items() if value is not None}
    return Ordering(predicted=sorted(labels, key=lambda label: predicted[label]),
                    measured=sorted(done, key=lambda label: done[label]), pairs=pairs,
                    ties=ties, holds=all(p["holds"] for p in pairs))


class GridPoint(TypedDict):
    """One value of a tuned setting: its penalty's mean over the seeds."""

    value: float
    mean: float | None
    """None where a seed diverged."""


class Tuned(TypedDict):
    """A setting chosen on a grid as the loss model's sources chose their learning rates:
    the value whose mean penalty over the seeds is lowest."""

    grid: list[GridPoint]
    """Every value tried, least first."""
    chosen: float
    at_edge: bool
    """Whether the chosen value is the grid's least or greatest (of two or more): the best
    may lie beyond the grid."""


def tune(by_value: Mapping[float, Sequence[float | None]]) -> Tuned:
    """The value of a setting (an outer learning rate) whose penalties at the seeds
    (`by_value`: each value's, the seeds in one order) have the lowest mean; a value that
    diverged at a seed is never chosen, equal means take the lesser value. ValueError
    where no value has a mean."""
    grid = [GridPoint(value=v, mean=seed_mean(by_value[v])) for v in sorted(by_value)]
    ranked = sorted((p["mean"], p["value"]) for p in grid if p["mean"] is not None)
    if not ranked:
        raise ValueError("no value of the grid trained without diverging at every seed")
    chosen = ranked[0][1]
    return Tuned(grid=grid, chosen=chosen,
                 at_edge=len(grid) > 1 and chosen in (grid[0]["value"], grid[-1]["value"]))
