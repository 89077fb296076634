"""Stragglers: a GPU, or every GPU of a datacenter, computing slower by a factor for a
while. Both backends stretch each forward and backward that starts in such a window:
the simulator's modeled time, the emulator's compute (emulated or real) held that many
times as long. Pure: no I/O."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NotRequired, TypedDict


@dataclass(frozen=True)
class Slowdown:
    """One window of slower compute, in seconds from the start of training."""

    start_s: float
    end_s: float | None
    """None: to the end of the run."""
    factor: float

    def covers(self, t: float) -> bool:
        return self.start_s <= t and (self.end_s is None or t < self.end_s)


StragglerEntry = TypedDict("StragglerEntry", {
    "at": str, "slower": float, "gpu": NotRequired[str], "dc": NotRequired[str],
    "for": NotRequired[str], "applied": NotRequired[bool]})
"""A straggler as a scenario file's entry; results.json's add `applied`
(testbed.scenario.reach)."""


@dataclass(frozen=True)
class Straggler:
    """A scenario's `stragglers` entry: `gpu` or `dc` slower by `slower` from `at_s`."""

    at_s: float
    for_s: float | None
    slower: float
    gpu: str | None = None
    dc: str | None = None

    def hits(self, gpus: Iterable[str], dc: str) -> bool:
        """Whether a worker on these GPUs (a tensor-parallel group has several) in `dc` is
        slowed: a group is as slow as its slowest GPU."""
        return self.dc == dc if self.dc is not None else self.gpu in set(gpus)

    def window(self) -> Slowdown:
        end = None if self.for_s is None else self.at_s + self.for_s
        return Slowdown(self.at_s, end, self.slower)

    def shifted(self, by: float) -> Straggler | None:
        """The same straggler on a clock that starts `by` seconds later; None if it was
        over by then."""
        end = None if self.for_s is None else self.at_s + self.for_s - by
        if end is not None and end <= 0:
            return None
        at = max(0.0, self.at_s - by)
        return dataclasses.replace(self, at_s=at, for_s=None if end is None else end - at)

    def dilated(self, k: float) -> Straggler:
        return dataclasses.replace(self, at_s=self.at_s * k,
                                   for_s=None if self.for_s is None else self.for_s * k)

    def as_raw(self) -> StragglerEntry:
        """As a scenario file's entry."""
        raw: StragglerEntry = {"at": f"{self.at_s:g}s", "slower": self.slower}
        if self.gpu is not None:
            raw["gpu"] = self.gpu
        elif self.dc is not None:
            raw["dc"] = self.dc
        if self.for_s is not None:
            raw["for"] = f"{self.for_s:g}s"
        return raw


def slowdowns_for(stragglers: Iterable[Straggler], gpus: Iterable[str], dc: str
                  ) -> list[Slowdown]:
    """The windows in which a worker on `gpus` in `dc` computes slower."""
    names = list(gpus)
    return [s.window() for s in stragglers if s.hits(names, dc)]


def factor_at(slowdowns: Sequence[Slowdown], t: float) -> float:
    """How many times longer a compute that starts at `t` takes: the product of the
    windows covering `t` (a slow GPU in a slow DC is slower still); 1 outside them."""
    factor = 1.0
    for slowdown in slowdowns:
        if slowdown.covers(t):
            factor *= slowdown.factor
    return factor


def first_over(windows: Sequence[tuple[int, Slowdown]], limit: float
               ) -> tuple[int, float, float] | None:
    """Where windows on one GPU (each with its index) together first slow it more than
    `limit` times: the index of the window whose start does it, that time and the product
    then; None where they never do. Windows are [start, end): one ending as another starts
    does not overlap it."""
    marks = sorted([(w.start_s, 1, i) for i, w in windows]
                   + [(w.end_s, 0, i) for i, w in windows if w.end_s is not None])
    by_index = dict(windows)
    open_log = 0.0
    bound = math.log(limit) + 1e-9
    for t, starts, index in marks:
        factor = math.log(by_index[index].factor)
        open_log += factor if starts else -factor
        if starts and open_log > bound:
            product = factor_at(list(by_index.values()), t)
            if product > limit:
                return index, t, product
    return None
