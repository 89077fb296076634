"""Plots (PNG, matplotlib, readable in black and white: markers and hatches, not colors)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from testbed.fsutil import atomic_output
from testbed.metrics.loss import LossPoint
from testbed.spans import Span


def save_png(fig: Any, path: Path, dpi: int) -> None:
    """Write a figure as `path` (never through a link there: testbed.fsutil) and close it."""
    try:
        with atomic_output(path) as handle:
            fig.savefig(handle, format="png", dpi=dpi)
    finally:
        plt.close(fig)


MARKERS = ["o", "s", "^", "D", "v", "x", "*", "P"]
LINES = ["-", "--", ":", "-."]


def sweep_plot(rows: Sequence[dict[str, Any]], keys: Sequence[str], path: Path) -> None:
    """Iteration time against the first varied key; one line per policy and other values."""
    x_key = keys[0]
    series: dict[str, list[tuple[str, float]]] = {}
    for row in rows:
        if row.get("iteration_s") is None:
            continue
        label = row["policy"] + "".join(f", {k}={row[k]}" for k in keys[1:])
        series.setdefault(label, []).append((str(row[x_key]), float(row["iteration_s"])))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    order = list(dict.fromkeys(str(row[x_key]) for row in rows))
    for i, (label, points) in enumerate(series.items()):
        xs = [order.index(x) for x, _ in points]
        ax.plot(xs, [y for _, y in points], color="black", marker=MARKERS[i % len(MARKERS)],
                linestyle=LINES[i % len(LINES)], label=label)
    ax.set_xticks(range(len(order)), order)
    ax.set_xlabel(x_key)
    ax.set_ylabel("iteration time (s)")
    ax.grid(True, color="0.85")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, 120)


HATCH = {"forward": "", "backward": "", "step": "", "allreduce": "xx", "recv": "..",
         "wait_grant": "//", "wait_send": "\\\\", "prefill": "oo", "kv_transfer": "--"}
SHADE = {"forward": "0.15", "backward": "0.45", "step": "0.7", "allreduce": "white",
         "recv": "white", "wait_grant": "white", "wait_send": "white", "prefill": "0.85",
         "kv_transfer": "white"}
GANTT_KINDS = tuple(HATCH)


def iteration_plot(rows: Sequence[Any], path: Path) -> None:
    """Median iteration time per policy combination, whiskers from min to max over repeats."""
    ok = [r for r in rows if r.iteration_s is not None]
    fig, ax = plt.subplots(figsize=(max(4.0, 1.3 * len(ok) + 1), 3.8))
    xs = list(range(len(ok)))
    medians = [r.iteration_s for r in ok]
    errors = [[r.iteration_s - r.iteration_low for r in ok],
              [r.iteration_high - r.iteration_s for r in ok]]
    hatches = ["", "//", "..", "xx", "\\\\", "--", "oo", "++"]
    for x, median in zip(xs, medians, strict=True):
        ax.bar(x, median, color="white", edgecolor="black", hatch=hatches[x % len(hatches)])
    ax.errorbar(xs, medians, yerr=errors, fmt="none", ecolor="black", capsize=4)
    ax.set_xticks(xs, [r.combo for r in ok], rotation=20, ha="right")
    ax.set_ylabel("iteration time (s)")
    ax.grid(True, axis="y", color="0.85")
    fig.tight_layout()
    save_png(fig, path, 120)


def loss_plot(curves: Sequence[tuple[str, Sequence[LossPoint]]], path: Path,
              target: float | None = None) -> None:
    """Training loss against represented time, one line per policy combination; the
    target loss dotted when one was given. A log-scale loss axis when the losses span
    more than a decade (a loss falling from its start to near zero), else linear."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    values = [p["loss"] for _, curve in curves for p in curve
              if p["loss"] is not None and math.isfinite(p["loss"])]
    for i, (label, curve) in enumerate(curves):
        points = [(p["time_s"], p["loss"]) for p in curve
                  if p["loss"] is not None and math.isfinite(p["loss"])]
        ax.plot([t for t, _ in points], [v for _, v in points], color="black",
                marker=MARKERS[i % len(MARKERS)], markevery=max(1, len(points) // 12),
                markersize=4, linestyle=LINES[i % len(LINES)], linewidth=1, label=label)
    if target is not None:
        ax.axhline(target, color="0.4", linestyle=":", linewidth=1,
                   label=f"target loss {target:g}")
    if values and min(values) > 0 and max(values) / min(values) > 10:
        ax.set_yscale("log")
    ax.set_xlabel("represented time since the run started (s)")
    ax.set_ylabel("training loss (cross-entropy, nats)")
    ax.grid(True, color="0.85")
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, 120)


def gantt_spans(spans: Sequence[Span], start: float, iteration: int
                ) -> tuple[list[Span], float, float]:
    """The spans one iteration's Gantt chart draws, and its time window: from the previous
    iteration's last optimizer step to this one's."""
    steps: dict[int, float] = {}
    for span in spans:
        if span["kind"] == "step":
            steps[span["iteration"]] = max(steps.get(span["iteration"], start), span["end"])
    lo = steps.get(iteration - 1, start)
    hi = steps.get(iteration, max((s["end"] for s in spans), default=start))
    shown = [s for s in spans if s["kind"] in GANTT_KINDS and s["end"] > lo and s["start"] < hi
             and s["end"] > s["start"]]
    return shown, lo, hi


GANTT_ROWS = 48


def gantt_plot(panels: Sequence[tuple[str, Sequence[Span], float, int]],
               path: Path) -> None:
    """Per-GPU timelines of one iteration for each policy, side by side; white is idle."""
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 0.35 * 16 + 1.5),
                             squeeze=False)
    for ax, (title, spans, start, iteration) in zip(axes[0], panels, strict=True):
        shown, lo, hi = gantt_spans(spans, start, iteration)
        by_gpu: dict[str, list[Span]] = {}
        for span in shown:
            by_gpu.setdefault(span["gpu"], []).append(span)
        gpus = sorted(by_gpu, key=_gpu_order)
        if len(gpus) > GANTT_ROWS:  # paper scale: an even sample of the GPUs
            title = f"{title} ({GANTT_ROWS} of {len(gpus)} GPUs)"
            gpus = gpus[::math.ceil(len(gpus) / GANTT_ROWS)][:GANTT_ROWS]
        for row, gpu in enumerate(gpus):
            for span in by_gpu[gpu]:
                a, b = max(span["start"], lo), min(span["end"], hi)
                ax.barh(row, b - a, left=a - lo, height=0.8, color=SHADE[span["kind"]],
                        edgecolor="black", linewidth=0.3, hatch=HATCH[span["kind"]])
        ax.set_yticks(range(len(gpus)), gpus, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlim(0, hi - lo)
        ax.set_xlabel(f"seconds into iteration {iteration + 1}")
        ax.set_title(title)
    handles = [Rectangle((0, 0), 1, 1, facecolor=SHADE[k], edgecolor="black", hatch=HATCH[k])
               for k in GANTT_KINDS]
    fig.legend(handles, GANTT_KINDS, loc="lower center", ncol=len(GANTT_KINDS), fontsize=8)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save_png(fig, path, 110)


def _gpu_order(gpu: str) -> tuple[str, int]:
    dc, _, index = gpu.rpartition("-")
    return dc, int(index) if index.isdigit() else 0


def wan_series(spans: Sequence[Span], start: float, capacity: dict[str, float],
               bins: int = 200) -> tuple[list[float], dict[str, list[float]]]:
    """Utilization of each WAN link direction over time: every transfer's bytes spread
    evenly over its duration, in `bins` equal slices of the run."""
    transfers = [(link, s) for s in spans if s["kind"] == "transfer" and (link := s.get("link"))]
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
    return [start + (i + 0.5) * width - start for i in range(bins)], series


def wan_plot(panels: Sequence[tuple[str, Sequence[Span], float, dict[str, float]]],
             path: Path) -> None:
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 2.4 * len(panels)), squeeze=False)
    for ax, (title, spans, start, capacity) in zip(axes[:, 0], panels, strict=True):
        xs, series = wan_series(spans, start, capacity)
        for i, (link, values) in enumerate(series.items()):
            ax.plot(xs, values, color="black", linestyle=LINES[i % len(LINES)], linewidth=1,
                    label=link)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("link utilization")
        ax.set_title(title, fontsize=10)
        ax.grid(True, color="0.85")
        if series:
            ax.legend(fontsize=7, ncol=3, loc="upper right")
    axes[-1, 0].set_xlabel("seconds since the run started")
    fig.tight_layout()
    save_png(fig, path, 110)
