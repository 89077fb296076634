"""A mean with its 95% confidence interval, for figures measured over a few repeats: the
Student t interval, exact for normal noise, with its quantiles tabulated (no SciPy)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
         2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
         2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
"""Two-sided 95% quantiles of Student's t for 1-30 degrees of freedom."""


def t975(df: int) -> float:
    if df < 1:
        raise ValueError("needs at least one degree of freedom")
    if df <= len(_T975):
        return _T975[df - 1]
    return 2.021 if df <= 40 else 2.000 if df <= 60 else 1.980 if df <= 120 else 1.960


@dataclass(frozen=True)
class Interval:
    mean: float
    low: float | None
    """None with fewer than two values: no spread to judge by."""
    high: float | None
    n: int

    @property
    def includes_zero(self) -> bool:
        return self.low is not None and self.high is not None and self.low <= 0 <= self.high

    def percent(self) -> str:
        """`+0.09%`, with `[low, high]` from two values on, and `0 inside` when the interval
        cannot tell the mean from none."""
        if self.low is None or self.high is None:
            return f"{self.mean:+.2%}"
        inside = ", 0 inside" if self.includes_zero else ""
        return f"{self.mean:+.2%} [{self.low:+.2%}, {self.high:+.2%}{inside}]"


def mean_interval(values: Sequence[float]) -> Interval:
    if not values:
        raise ValueError("no values")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, None, None, len(values))
    half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half, len(values))
