"""Plots of runs, comparisons and sweeps, readable in black and white (markers and
dashes, not colors), each with the CSV of what it draws beside it (figure_files)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.ticker import PercentFormatter

from testbed.common.units import human_rate, parse_duration, parse_per_second, parse_rate
from testbed.metrics.link_use import LinkUse
from testbed.metrics.loss import LossPoint
from testbed.report.figure_files import (
    beside,
    legend_beside,
    line_style,
    log_axis,
    save_figure,
    spans_decade,
    write_csv,
)


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


def sweep_plot(rows: Sequence[Mapping[str, str | int | float | None]], keys: Sequence[str],
               path: Path) -> None:
    """Iteration time against the first varied key, on a numeric axis where its values
    are numbers (log where they span more than a decade); one line per policy and other
    values, each its own marker and dashes."""
    x_key = keys[0]
    order = list(dict.fromkeys(str(row[x_key]) for row in rows))
    numeric = axis_values(x_key, order)
    position = dict(zip(order, numeric[0] if numeric else range(len(order)), strict=True))
    series: dict[str, list[tuple[float, float]]] = {}
    for row in rows:
        iteration = row.get("iteration_s")
        if not isinstance(iteration, int | float):  # None: the run failed
            continue
        label = str(row["policy"]) + "".join(f", {k}={row[k]}" for k in keys[1:])
        series.setdefault(label, []).append((position[str(row[x_key])], float(iteration)))
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
        legend_beside(ax)
    save_figure(fig, path)


@dataclass(frozen=True)
class Throughput:
    """One policy combination's throughput over its repeats, and its time to the target
    loss where one was given."""

    combo: str
    tokens_per_s: float | None
    """The median over repeats; None when no run of it measured one."""
    low: float | None
    high: float | None
    speedup: float | None = None
    to_loss_s: float | None = None
    to_loss_text: str | None = None
    """The table's cell for the time to loss (`12.3 s`, `not reached`, `n/a
    (simulated)`...)."""
    to_loss_band: tuple[float | None, float | None] = (None, None)
    """A predicted time's band (None: that end never reaches the target)."""
    predicted: bool = False
    """The time is the loss model's prediction, not measured."""


def throughput_plot(points: Sequence[Throughput], path: Path,
                    target: float | None = None) -> None:
    """Tokens/s per policy combination, the yardstick speed-ups are ratios of: a dot at
    the median, a whisker from the lowest to the highest repeat (points, not bars: a log
    axis, taken when one is more than ten times another, has no zero for a bar to start
    from); beside it, with a target loss, the time to reach it."""
    ok = [p for p in points if p.tokens_per_s is not None]
    panels = 2 if target is not None else 1
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels + 1.6, 0.5 * len(ok) + 1.4),
                             squeeze=False, sharey=True)
    ys = list(range(len(ok)))
    ax = axes[0, 0]
    ax.errorbar([p.tokens_per_s for p in ok], ys, fmt="o", color="black", capsize=4,
                xerr=[[(p.tokens_per_s or 0) - (p.low or p.tokens_per_s or 0) for p in ok],
                      [(p.high or p.tokens_per_s or 0) - (p.tokens_per_s or 0) for p in ok]])
    for y, point in zip(ys, ok, strict=True):
        ratio = f" ({point.speedup:.2f}x)" if point.speedup is not None else ""
        ax.annotate(f"{point.tokens_per_s:,.0f}{ratio}",
                    (point.high or point.tokens_per_s or 0, y),
                    xytext=(6, 0), textcoords="offset points", va="center", fontsize=8)
    highest = max((p.high or p.tokens_per_s or 0 for p in ok), default=1.0)
    if spans_decade([v for p in ok for v in (p.tokens_per_s, p.low)]):
        log_axis(ax, "x")  # room on the right for the labels, as on the linear axis
        ax.set_xlim(min(p.low or p.tokens_per_s or 1 for p in ok) / 1.5, highest * 4)
    else:
        ax.set_xlim(0, highest * 1.35)
    ax.set_xlabel("training throughput (tokens/s)")
    ax.set_yticks(ys, [p.combo for p in ok])
    ax.set_ylim(max(len(ok), 1) - 0.5, -0.5)
    if not ok:
        ax.text(0.5, 0.5, "no run measured its throughput", transform=ax.transAxes,
                ha="center", va="center", fontsize=9, color="0.3")
    ax.grid(True, axis="x", color="0.85", which="both")
    if target is not None:
        _to_loss_panel(axes[0, 1], ok, target)
    save_figure(fig, path)
    write_csv(beside(path), ["policy", "tokens_per_s", "min", "max", "speedup",
                             "time_to_loss_s", "time_to_loss_fastest_s",
                             "time_to_loss_slowest_s", "time_to_loss_basis"],
              [(p.combo, p.tokens_per_s, p.low, p.high, p.speedup, p.to_loss_s,
                *p.to_loss_band, "predicted" if p.predicted else "measured") for p in ok])


def _to_loss_panel(ax: Any, points: Sequence[Throughput], target: float) -> None:
    """Time to the target loss per combination, a predicted one with a line across its
    band (an arrow where the band's slow end never reaches the target); those without
    one say why, in words. In seconds, hours or days, whichever the times are; a log
    axis when one is more than ten times another."""
    found = [t for p in points for t in (p.to_loss_s, *p.to_loss_band) if t is not None]
    unit, size = _time_unit(statistics.median(found) if found else 1.0)
    reached = [(y, p.to_loss_s / size) for y, p in enumerate(points) if p.to_loss_s is not None]
    ax.plot([t for _, t in reached], [y for y, _ in reached], "s", color="black")
    scaled = [t / size for t in found]
    longest = max(scaled, default=1.0) or 1.0
    log = spans_decade(scaled)
    for y, point in enumerate(points):
        text = point.to_loss_text or "-"
        if point.to_loss_s is None:
            ax.text(min(scaled, default=1.0) if log else 0.02 * longest, y, text,
                    va="center", fontsize=8, color="0.3")
            continue
        fastest, slowest = point.to_loss_band
        if point.predicted and fastest is not None:
            end = slowest / size if slowest is not None else longest * 1.5
            ax.plot([fastest / size, end], [y, y], color="black", linewidth=1)
            if slowest is None:
                ax.annotate("", (longest * 2, y), (longest * 1.5, y),
                            arrowprops={"arrowstyle": "->", "color": "black"})
        ax.annotate(text, (point.to_loss_s / size, y), xytext=(6, 6 if point.predicted else 0),
                    textcoords="offset points", va="center", fontsize=8)
    if log:
        log_axis(ax, "x")
        if longest / min(scaled) > 1e3:  # a label per decade, no more
            from matplotlib.ticker import LogLocator

            ax.xaxis.set_major_locator(LogLocator(subs=(1.0,)))
        ax.set_xlim(min(scaled) / 2, longest * 4)
    else:
        ax.set_xlim(0, longest * 1.5)
    if not reached:
        ax.set_xticks([])  # no time to show
    band = ", predicted: band as a line" if any(p.predicted for p in points) else ""
    ax.set_xlabel(f"time to loss {target:g} ({unit}{band})")
    ax.grid(True, axis="x", color="0.85", which="both")


def _time_unit(typical_s: float) -> tuple[str, float]:
    """The unit a typical time reads best in."""
    for unit, size in (("days", 86400.0), ("h", 3600.0)):
        if typical_s >= 2 * size:
            return unit, size
    return "s", 1.0


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
    legend_beside(ax)
    save_figure(fig, path)
    write_csv(beside(path), ["policy", "iteration", "time_s", "tokens", "loss"],
              [(label, p["iteration"], p["time_s"], p["tokens"], p["loss"])
               for label, points in kept for p in points])


ZOOM_BELOW = 0.25
"""A WAN panel whose links never carried more than this share of their rate is drawn up
to its peak, not to 100%, so that its shape shows."""


@dataclass(frozen=True)
class WanPanel:
    """One run's WAN use over its own length (testbed.metrics.link_use)."""

    title: str
    use: LinkUse
    length_s: float
    raised: Mapping[str, float] = field(default_factory=dict)
    """Directions an event or trace gave a rate above the topology's: the highest (bit/s).
    Only these may show more than 100%."""


def wan_plot(panels: Sequence[WanPanel], path: Path) -> None:
    """WAN link use over time, a panel per run, each on its own time scale (a run of an
    hour and one of a minute side by side on one axis would leave the short one a
    sliver); each link direction's share of its rate, the legend beside the axes."""
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.5, 2.3 * len(panels) + 0.4),
                             squeeze=False)
    rows: list[tuple[str, str, float, float]] = []
    for ax, panel in zip(axes[:, 0], panels, strict=True):
        peak = max((v for values in panel.use.utilization.values() for v in values),
                   default=0.0)
        for i, (link, values) in enumerate(panel.use.utilization.items()):
            label = link
            if link in panel.raised:
                label += f" (rate raised to {human_rate(panel.raised[link])} by an event)"
            ax.plot(panel.use.times, values, linewidth=1, label=label,
                    **{**line_style(i), "marker": None})
            rows += [(panel.title, link, x, v)
                     for x, v in zip(panel.use.times, values, strict=True)]
        # up to the link's rate, or closer where the run never came near it
        ax.set_ylim(0, (max(peak, 1.0) if peak > ZOOM_BELOW else peak or 1.0) * 1.03)
        ax.set_xlim(0, panel.length_s)
        ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_ylabel("share of link rate")
        ax.set_xlabel("seconds since the run started")
        ax.set_title(f"{panel.title}: {panel.length_s:.4g} s, peak {peak:.1%} of a link's "
                     "rate", fontsize=10)
        ax.grid(True, color="0.85")
        if panel.use.utilization:
            legend_beside(ax, fontsize=7, title="link", title_fontsize=7)
        else:
            ax.text(0.5, 0.5, "no traffic crossed the WAN", transform=ax.transAxes,
                    ha="center", va="center", fontsize=9, color="0.3")
    fig.tight_layout()
    save_figure(fig, path)
    write_csv(beside(path), ["policy", "link", "time_s", "utilization"], rows)
