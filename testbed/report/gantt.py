"""The Gantt chart of one iteration per policy combination: a row per GPU in pipeline
order (each replica's stages in turn), every panel on one time scale, one above the
other, and what a GPU does drawn over what it waits for (a prefill inside a receive's
wait shows)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from testbed.common.spans import Span
from testbed.report.figure_files import beside, save_figure, write_csv

HATCH = {"forward": "", "backward": "", "step": "", "allreduce": "xx", "recv": "..",
         "wait_grant": "//", "wait_send": "\\\\", "prefill": "oo", "kv_transfer": "--"}
SHADE = {"forward": "0.15", "backward": "0.45", "step": "0.7", "allreduce": "white",
         "recv": "white", "wait_grant": "white", "wait_send": "white", "prefill": "0.85",
         "kv_transfer": "white"}
GANTT_KINDS = tuple(HATCH)
LAYER = {"recv": 1, "wait_grant": 1, "wait_send": 1, "allreduce": 1, "forward": 2,
         "backward": 2, "step": 2, "kv_transfer": 3, "prefill": 4}
"""Drawing order: waits first, then compute, then inference on top of both."""
GANTT_ROWS = 48
WIDTH_IN = 10.0
VISIBLE_PARTS = 1000
"""A bar shorter than this part of the time axis is under a pixel wide: a kind whose bars
all are says so in the legend."""


@dataclass(frozen=True)
class GanttPanel:
    title: str
    spans: Sequence[Span]
    start: float
    iteration: int
    placement: Mapping[str, Sequence[str]] = field(default_factory=dict)
    """The plan's `placement` ("replica,stage": its GPUs), which orders the rows."""


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


def pipeline_order(gpus: Sequence[str], placement: Mapping[str, Sequence[str]]
                   ) -> list[str]:
    """GPUs as the pipelines run through them: replica 0's stages in order, then replica
    1's...; any the placement does not name after them, by DC and index."""
    def cell(key: str) -> tuple[int, ...]:
        return tuple(int(p) if p.isdigit() else 0 for p in key.split(","))

    ordered = [g for key in sorted(placement, key=cell) for g in placement[key]]
    seen = dict.fromkeys(g for g in ordered if g in set(gpus))
    rest = sorted(set(gpus) - set(seen), key=_gpu_order)
    return [*seen, *rest]


def _gpu_order(gpu: str) -> tuple[str, int]:
    dc, _, index = gpu.rpartition("-")
    return dc, int(index) if index.isdigit() else 0


def gantt_plot(panels: Sequence[GanttPanel], path: Path) -> None:
    """Per-GPU timelines of one iteration for each policy, stacked on one time axis
    (the longest iteration's); white is idle. The CSV lists every bar drawn."""
    windows = [gantt_spans(p.spans, p.start, p.iteration) for p in panels]
    length = max((hi - lo for _, lo, hi in windows), default=1.0) or 1.0
    layouts = []
    for panel, (shown, _, _) in zip(panels, windows, strict=True):
        gpus = pipeline_order(sorted({s["gpu"] for s in shown}), panel.placement)
        title = f"{panel.title}: iteration {panel.iteration + 1}"
        if len(gpus) > GANTT_ROWS:  # paper scale: an even sample of the pipelines' GPUs
            title = f"{title} ({GANTT_ROWS} of {len(gpus)} GPUs)"
            gpus = gpus[::math.ceil(len(gpus) / GANTT_ROWS)][:GANTT_ROWS]
        layouts.append((title, gpus))
    heights = [0.9 + 0.2 * max(1, len(gpus)) for _, gpus in layouts]
    height_in = sum(heights) + 0.9
    fig, axes = plt.subplots(len(panels), 1, figsize=(WIDTH_IN, height_in),
                             squeeze=False, sharex=True,
                             gridspec_kw={"height_ratios": heights})
    bars: list[tuple[str, str, int, str, float, float]] = []
    for ax, (title, gpus), (shown, lo, hi) in zip(axes[:, 0], layouts, windows, strict=True):
        row_of = {gpu: row for row, gpu in enumerate(gpus)}
        groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for span in shown:
            if span["gpu"] in row_of:
                a, b = max(span["start"], lo) - lo, min(span["end"], hi) - lo
                groups.setdefault((span["gpu"], span["kind"]), []).append((a, b - a))
                bars.append((title, span["gpu"], row_of[span["gpu"]], span["kind"], a, b))
        for (gpu, kind), ranges in sorted(groups.items(), key=lambda g: LAYER[g[0][1]]):
            ax.broken_barh(ranges, (row_of[gpu] - 0.4, 0.8), facecolors=SHADE[kind],
                           edgecolor="black", linewidth=0.3, hatch=HATCH[kind],
                           zorder=LAYER[kind])
        ax.set_yticks(range(len(gpus)), gpus, fontsize=7)
        ax.set_ylim(len(gpus) - 0.5, -0.5)
        ax.set_xlim(0, length)
        ax.set_title(title, fontsize=10)
    axes[-1, 0].set_xlabel("seconds into the iteration (from the previous one's last step)")
    drawn = [k for k in GANTT_KINDS if any(bar[3] == k for bar in bars)]  # nothing else
    handles = [Rectangle((0, 0), 1, 1, facecolor=SHADE[k], edgecolor="black", hatch=HATCH[k])
               for k in drawn]
    unseen = length / VISIBLE_PARTS
    labels = [k if any(bar[3] == k and bar[5] - bar[4] >= unseen for bar in bars)
              else f"{k} (too short to see)" for k in drawn]
    if drawn:  # under the axes, in the half inch kept free for it
        fig.legend(handles, labels, loc="lower center", ncol=min(len(drawn), 5), fontsize=8,
                   bbox_to_anchor=(0.5, 0.0))
    fig.tight_layout(rect=(0, 0.5 / height_in if drawn else 0, 1, 1))
    save_figure(fig, path)
    write_csv(beside(path), ["policy", "gpu", "row", "kind", "start_s", "end_s"], bars)
