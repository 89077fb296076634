"""Nearest-rank percentiles: a value that was measured, never one interpolated between two."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], q: float) -> float | None:
    """The smallest value with at least a fraction `q` of `values` at or below it; None
    when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
