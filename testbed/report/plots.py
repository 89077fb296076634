"""Plots of comparisons and sweeps, readable in black and white (markers, dashes and
hatches, not colors), each with the CSV of what it draws beside it (figure_files)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from testbed.common.spans import Span
from testbed.common.units import parse_duration, parse_per_second, parse_rate
from testbed.metrics.loss import LossPoint
from testbed.report.figure_files import (
    beside,
    line_style,
    log_axis,
    save_figure,
    spans_decade,
    write_csv,
)

HATCHES = ("", "//", "..", "xx", "\\\\", "--", "oo", "++")


def axis_values(key: str, values: Sequence[str]) -> tuple[list[float], str] | None:
    """Values of a swept key as numbers on a numeric axis with its label: latencies in ms,
    bandwidths in Gbit/s, arrival rates per second, plain numbers as they are; None when
    any is not a number."""
    try:
        if key.endswith("latency"):
            return [parse_duration(v) * 1e3 for v in values], f"{key} (ms)"
        if key.endswith("bandwidth"):
            return [parse_rate(v) / 1e9 for v in values], f"{key} (Gbit/s)"
        if key.endswith("arrival_rate"):
            return [parse_per_second(v) for v in values], f"{key} (per s)"
        return [float(v) for v in values], key
    except ValueError:
        return None


def sweep_plot(rows: Sequence[dict[str, Any]], keys: Sequence[str], path: Path) -> None:
    """Iteration time against the first varied key, on a numeric axis where its values
    are numbers (log where they span more than a decade); one line per policy and other
    values, each its own marker and dashes."""
    x_key = keys[0]
    order = list(dict.fromkeys(str(row[x_key]) for row in rows))
    numeric = axis_values(x_key, order)
    position = dict(zip(order, numeric[0] if numeric else range(len(order)), strict=True))
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        if row.get("iteration_s") is None:
            continue
        label = row["policy"] + "".join(f", {k}={row[k]}" for k in keys[1:])
        series.setdefault(label, []).append((position[str(row[x_key])],
                                             float(row["iteration_s"])))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (label, points) in enumerate(series.items()):
        points.sort()
        ax.plot([x for x, _ in points], [y for _, y in points], label=label, **line_style(i))
    if numeric:
        ax.set_xlabel(numeric[1])
        if spans_decade(numeric[0]):
            log_axis(ax, "x")
    else:
        ax.set_xticks(range(len(order)), order)
        ax.set_xlabel(x_key)
    if spans_decade(y for points in series.values() for _, y in points):
        log_axis(ax, "y")
    ax.set_ylabel("iteration time (s)")
    ax.grid(True, color="0.85", which="both")
    if series:
        ax.legend(fontsize=8)
    save_figure(fig, path)


def iteration_plot(rows: Sequence[Any], path: Path) -> None:
    """Median iteration time per policy combination, whiskers from min to max over
    repeats; a log axis when one is more than ten times another."""
    ok = [r for r in rows if r.iteration_s is not None]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(ok) + 1), 3.8))
    xs = list(range(len(ok)))
    medians = [r.iteration_s for r in ok]
    errors = [[r.iteration_s - r.iteration_low for r in ok],
              [r.iteration_high - r.iteration_s for r in ok]]
    for x, median in zip(xs, medians, strict=True):
        ax.bar(x, median, color="white", edgecolor="black", hatch=HATCHES[x % len(HATCHES)])
    ax.errorbar(xs, medians, yerr=errors, fmt="none", ecolor="black", capsize=4)
    ax.set_xticks(xs, [r.combo for r in ok], rotation=20, ha="right")
    if spans_decade([*medians, *(r.iteration_low for r in ok)]):
        log_axis(ax, "y")
    ax.set_ylabel("iteration time (s)")
    ax.grid(True, axis="y", color="0.85", which="both")
    save_figure(fig, path)
    write_csv(beside(path), ["policy", "iteration_s", "min_s", "max_s"],
              [(r.combo, r.iteration_s, r.iteration_low, r.iteration_high) for r in ok])


def loss_plot(curves: Sequence[tuple[str, Sequence[LossPoint]]], path: Path,
              target: float | None = None) -> None:
    """Training loss against represented time, one line per policy combination; the
    target loss dotted when one was given. A log-scale loss axis when the losses span
    more than a decade (a loss falling from its start to near zero), else linear."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    kept = [(label, [p for p in curve if p["loss"] is not None and math.isfinite(p["loss"])])
            for label, curve in curves]
    for i, (label, points) in enumerate(kept):
        ax.plot([p["time_s"] for p in points], [p["loss"] or 0.0 for p in points],  # None left out
                markevery=max(1, len(points) // 12), markersize=4, linewidth=1, label=label,
                **line_style(i))
    if target is not None:
        ax.axhline(target, color="0.4", linestyle=":", linewidth=1,
                   label=f"target loss {target:g}")
    if spans_decade(p["loss"] for _, points in kept for p in points):
        log_axis(ax, "y")
    ax.set_xlabel("represented time since the run started (s)")
    ax.set_ylabel("training loss (cross-entropy, nats)")
    ax.grid(True, color="0.85")
    ax.legend(fontsize=8)
    save_figure(fig, path)
    write_csv(beside(path), ["policy", "iteration", "time_s", "tokens", "loss"],
              [(label, p["iteration"], p["time_s"], p["tokens"], p["loss"])
               for label, points in kept for p in points])


def wan_series(spans: Sequence[Span], start: float, capacity: dict[str, float],
               bins: int = 200, end: float | None = None
               ) -> tuple[list[float], dict[str, list[float]]]:
    """Utilization of each WAN link direction over time: every transfer's bytes spread
    evenly over its duration, in `bins` equal slices from `start` to `end` (default:
    the last transfer's end)."""
    transfers = [(link, s) for s in spans if s["kind"] == "transfer" and (link := s.get("link"))]
    if end is None:
        end = max((s["end"] for _, s in transfers), default=start + 1.0)
    width = (end - start) / bins
    series = {link: [0.0] * bins for link in sorted({link for link, _ in transfers})}
    for link, span in transfers:
        duration = max(span["end"] - span["start"], 1e-9)
        rate = span.get("bytes", 0) * 8 / duration
        first = int((span["start"] - start) / width)
        last = min(bins - 1, int((span["end"] - start) / width))
        for i in range(max(0, first), last + 1):
            lo, hi = start + i * width, start + (i + 1) * width
            overlap = min(hi, span["end"]) - max(lo, span["start"])
            if overlap > 0:
                series[link][i] += rate * overlap / width
    for link, values in series.items():
        cap = capacity.get(link, 0.0)
        series[link] = [v / cap if cap else 0.0 for v in values]
    return [(i + 0.5) * width for i in range(bins)], series


def wan_plot(panels: Sequence[tuple[str, Sequence[Span], float, dict[str, float]]],
             path: Path) -> None:
    """WAN utilization over time per policy combination, one above the other on one time
    scale (the longest run's)."""
    ends = [max((s["end"] for s in spans if s["kind"] == "transfer" and s.get("link")),
                default=start + 1.0) - start for _, spans, start, _ in panels]
    length = max(ends, default=1.0)
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.2 * len(panels) + 0.6),
                             squeeze=False, sharex=True)
    rows: list[tuple[str, str, float, float]] = []
    for ax, (title, spans, start, capacity) in zip(axes[:, 0], panels, strict=True):
        xs, series = wan_series(spans, start, capacity, end=start + length)
        for i, (link, values) in enumerate(series.items()):
            style = {**line_style(i), "marker": None}
            ax.plot(xs, values, linewidth=1, label=link, **style)
            rows += [(title, link, x, v) for x, v in zip(xs, values, strict=True)]
        ax.set_ylim(0, 1.05)
        ax.set_xlim(0, length)
        ax.set_ylabel("link utilization")
        ax.set_title(title, fontsize=10)
        ax.grid(True, color="0.85")
        if series:
            ax.legend(fontsize=7, ncol=3, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the run started")
    save_figure(fig, path)
    write_csv(beside(path), ["policy", "link", "time_s", "utilization"], rows)
