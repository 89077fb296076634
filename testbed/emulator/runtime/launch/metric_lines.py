"""A program's own metrics: a line `TESTBED_METRIC {"step": 3, "loss": 2.31}` on its
output, or the JSON object alone as a line of the file $TESTBED_METRICS names. Pure:
text in, typed points out; the loss among them becomes a loss curve
(testbed.metrics.loss), as a testbed run's own loss does.

Keys: `step` (a whole number), `time` (Unix seconds, `time.time()`, where the program
wants its own time stamp; else the launch's, when it read the line) and any others whose
values are numbers (or null). `loss` and `tokens` (tokens this rank processed in the
step; count each token once across ranks) make the loss curve."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from testbed.emulator.runtime.launch.ranks import METRICS_PREFIX
from testbed.metrics.loss import LossPoint, loss_curve
from testbed.report.launch_results import MetricPoint

MAX_LINE = 64 * 1024
"""Longer lines are not read as metrics."""
MAX_VALUES = 64


def parse_metric(text: str, rank: int, read_s: float, epoch: float) -> MetricPoint | None:
    """One metric object (without the prefix) as a point, or None where it is not one:
    not JSON, not an object, or nothing numeric in it. `epoch`: the Unix time of the
    launch's start (for a `time` the program gave)."""
    if len(text) > MAX_LINE:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    step = data.pop("step", None)
    if not (isinstance(step, int) and not isinstance(step, bool) and step >= 0):
        step = None
    stamp = data.pop("time", None)
    time_s = read_s
    if isinstance(stamp, int | float) and not isinstance(stamp, bool) and \
            math.isfinite(stamp):
        time_s = float(stamp) - epoch
    values: dict[str, float | None] = {}
    for key, value in list(data.items())[:MAX_VALUES]:
        if isinstance(value, bool) or not isinstance(key, str):
            continue
        if value is None:
            values[key] = None
        elif isinstance(value, int | float):
            values[key] = float(value) if math.isfinite(value) else None
    if not values and step is None:
        return None
    return MetricPoint(rank=rank, time_s=round(time_s, 6), step=step, values=values)


def metric_in_output(line: str, rank: int, read_s: float, epoch: float) -> MetricPoint | None:
    """A line of the program's output that reports a metric (METRICS_PREFIX first)."""
    if not line.startswith(METRICS_PREFIX):
        return None
    return parse_metric(line[len(METRICS_PREFIX):], rank, read_s, epoch)


def launch_loss_curve(points: Sequence[MetricPoint]) -> list[LossPoint] | None:
    """Loss by step: the mean of the ranks' losses of each step, at the time the last of
    them reported it, with the tokens reported up to it; None without a loss."""
    losses: dict[int, list[float | None]] = {}
    ends: dict[int, float] = {}
    tokens: dict[int, int] = {}
    for point in points:
        step = point["step"]
        if step is None:
            continue
        if "loss" in point["values"]:
            losses.setdefault(step, []).append(point["values"]["loss"])
            ends[step] = max(ends.get(step, point["time_s"]), point["time_s"])
        count = point["values"].get("tokens")
        if count is not None:
            tokens[step] = tokens.get(step, 0) + int(count)
    if not losses:
        return None
    last = max(losses)
    mean: dict[int, float] = {}
    for step, values in losses.items():
        finite = [v for v in values if v is not None]
        mean[step] = sum(finite) / len(finite) if len(finite) == len(values) else math.nan
    times, before = [], 0.0
    for step in range(last + 1):
        before = ends.get(step, before)
        times.append(before)
    return loss_curve(mean, times, [tokens.get(step, 0) for step in range(last + 1)])
