"""The figures `testbed figures` draws, ready for a paper: per claim its runs against the
baseline and the paper's target; per claim the heat map of its search over WAN latency
and bandwidth; BubbleTea's load curve. Each with the CSV of what it plots beside it."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from testbed.figures.claim_runs import ClaimRun
from testbed.figures.claims import BACKENDS, SPEEDUPS
from testbed.figures.collect import ClaimRecord
from testbed.figures.frontier import ClaimSearch
from testbed.figures.load_curve import LoadPoint
from testbed.figures.loss_map import Cell, summary, with_target
from testbed.figures.render import fmt, verdict
from testbed.figures.space import Point
from testbed.report.figure_files import (
    beside,
    legend_beside,
    line_style,
    log_axis,
    save_figure,
    spans_decade,
    wrap,
    write_csv,
)

HATCHES = ("", "//", "xx", "..", "\\\\", "oo")
BACKEND_NAMES = {"simulate": "simulated", "emulate": "emulated"}
UNITS = {"x": "times the baseline (x)", "%": "percent", "of linear": "of linear scaling"}


@dataclass
class Bars:
    labels: list[str]
    values: list[float]
    ylabel: str
    lines: list[tuple[float, str]] = field(default_factory=list)
    """Horizontal references: (height, legend label)."""


def claim_plot(record: ClaimRecord, path: Path) -> None:
    """Per backend, what the claim's figure is made of, against its baseline and the
    paper's target; the search's "up to" under it."""
    panels = [(b, record["detail"][b]) for b in BACKENDS if b in record["detail"]]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.8 * max(1, len(panels)), 4.0),
                             squeeze=False)
    rows: list[tuple[str, str, float, str]] = []
    for ax, (backend, figures) in zip(axes[0], panels, strict=False):
        bars = _bars(record, figures.get("runs", {}))
        xs = range(len(bars.values))
        heights = [*bars.values, *(h for h, _ in bars.lines)]
        finite = [h for h in heights if math.isfinite(h)]
        if spans_decade(heights):  # points: a log axis has no zero for a bar to start from
            ax.plot(list(xs), bars.values, linestyle="none", marker="o", color="black")
            log_axis(ax, "y")
            ax.set_ylim(min(finite) / 1.6, max(finite) * 1.6)
        else:
            ax.bar(xs, bars.values, color="white", edgecolor="black",
                   hatch=[HATCHES[i % len(HATCHES)] for i in xs])
            if finite:
                ax.set_ylim(0, max(finite) * 1.15)
        for i, (height, label) in enumerate(bars.lines):
            ax.axhline(height, color="black", linewidth=1, label=label,
                       linestyle=("--", ":", "-.")[i % 3])
        ax.set_xticks(list(xs), bars.labels, rotation=20, ha="right", fontsize=8)
        ax.set_xlim(-0.6, len(bars.values) - 0.4)
        ax.set_ylabel(bars.ylabel)
        ax.set_title(f"{BACKEND_NAMES[backend]}: {fmt(figures.get('value'), record['unit'])}",
                     fontsize=10)
        ax.grid(True, axis="y", color="0.85", which="both")
        rows += [(backend, label, value, bars.ylabel)
                 for label, value in zip(bars.labels, bars.values, strict=True)]
    fig.suptitle(wrap(f"{record['claim']} ({record['conditions']})"), fontsize=9)
    fig.tight_layout()
    bottom = 0.0
    lines = {label: handle for ax in axes[0] for handle, label in
             zip(*ax.get_legend_handles_labels(), strict=True)}
    if lines:  # the references' legend under the panels, off their data
        legend = fig.legend(list(lines.values()), list(lines), loc="upper center",
                            bbox_to_anchor=(0.5, 0.0), ncol=len(lines), fontsize=7)
        fig.canvas.draw()
        bottom = legend.get_window_extent().transformed(fig.transFigure.inverted()).y0
    up_to = record.get("up_to")
    if up_to and up_to.get("value") is not None:
        fig.text(0.5, bottom - 0.02, wrap(f"Searched in the simulator: up to "
                                          f"{fmt(up_to['value'], record['unit'])} "
                                          f"({verdict(record)}at {up_to['conditions']})", 110),
                 ha="center", va="top", fontsize=7)
    save_figure(fig, path)
    write_csv(beside(path), ["backend", "bar", "value", "quantity"], rows)


def _bars(record: ClaimRecord, runs: dict[str, ClaimRun]) -> Bars:
    """The bars of a claim whose runs all ran; iteration times of those that did else."""
    if any("error" in r for r in runs.values()):
        ran = {k: r for k, r in runs.items() if "error" not in r}
        return Bars(list(ran), [r.get("iteration_s") or 0.0 for r in ran.values()],
                    "iteration time (s)")
    claim_id, target, paper = record["id"].partition(":")[0], record["target"], record["paper"]
    if "transfer" in runs:
        t = runs["transfer"]
        bars = Bars(["1 connection", f"{t['connections']} connections"],
                    [t["one_connection_s"], t["many_connections_s"]], "transfer time (s)")
        if t.get("many_connections_paced_s") is not None:
            bars.labels.append(f"{t['connections']}, paced")
            bars.values.append(t["many_connections_paced_s"])
        if target:
            bars.lines.append((t["one_connection_s"] / target, f"paper: {paper}"))
        return bars
    if claim_id in SPEEDUPS:
        _, slow = SPEEDUPS[claim_id]
        base = max(slow, key=lambda k: runs[k].get("tokens_per_s") or 0.0)
        rate = runs[base].get("tokens_per_s") or math.nan
        bars = Bars([k + (" (baseline)" if k == base else "") for k in runs],
                    [(r.get("tokens_per_s") or 0.0) / rate for r in runs.values()],
                    f"throughput against {base} (x)")
        if target:
            bars.lines.append((target, f"paper: {paper}"))
        return bars
    if record["unit"] == "of linear":
        one = next(iter(runs.values())).get("tokens_per_s") or math.nan
        bars = Bars(list(runs), [(r.get("tokens_per_s") or 0.0) / one for r in runs.values()],
                    "throughput against one DC (x)")
        if target:
            bars.lines.append((target * len(runs), f"{target:g} of linear at {len(runs)} DCs "
                                                   f"(paper: {paper})"))
        return bars
    if claim_id == "bubbles_after_atlas":
        u = runs["atlas"].get("utilization_training") or 0.0
        return Bars(["computing", "idle"], [100 * u, 100 * (1 - u)], "Atlas's GPU time (%)")
    if claim_id == "bubbletea_utilization":
        r = runs["bubbletea"]
        bars = Bars(["training alone", "with prefills"],
                    [100 * (r.get("utilization_training") or 0.0),
                     100 * (r.get("utilization_total") or 0.0)], "GPU utilization (%)")
        if target:
            bars.lines.append((target, f"target {target:g}% (paper: {paper})"))
        return bars
    if claim_id == "bubbletea_slowdown":
        rates = {k: r.get("tokens_per_s") or 0.0 for k, r in runs.items()}
        bars = Bars(list(rates), [v / (rates.get("none") or math.nan) for v in rates.values()],
                    "throughput against training alone (x)")
        if target:
            bars.lines.append((1 / (1 + target / 100), f"{target:g}% slower (paper: {paper})"))
        return bars
    return Bars(list(runs), [r.get("iteration_s") or 0.0 for r in runs.values()],
                "iteration time (s)")


def heat_map(found: ClaimSearch, claim: str, unit: str, path: Path) -> None:
    """The claim's figure over the grid of WAN latency x bandwidth (the conditions' own
    TCP, model and DCs), the cells that reach the target outlined; the CSV has every
    point searched, the other knobs' too."""
    grid = {p: f.get("value") for p, f in found.frontier.results.items()
            if p == Point(p.latency_ms, p.bandwidth_gbit)}
    lats = sorted({p.latency_ms for p in grid})
    bws = sorted({p.bandwidth_gbit for p in grid})
    values = [[grid.get(Point(lat, bw)) for bw in bws] for lat in lats]
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    shown = [[math.nan if v is None else v for v in row] for row in values]
    finite = [v for row in shown for v in row if not math.isnan(v)]
    mesh = ax.pcolormesh(_edges(bws), _edges(lats), shown, cmap="Greys",
                         vmin=min(finite, default=0), vmax=max(finite, default=1),
                         shading="flat")
    log_axis(ax, "x")
    log_axis(ax, "y")
    middle = (min(finite, default=0) + max(finite, default=1)) / 2
    for i, lat in enumerate(lats):
        for j, bw in enumerate(bws):
            value = values[i][j]
            ax.text(bw, lat, fmt(value, unit) if value is not None else "n/a", ha="center",
                    va="center", fontsize=8,
                    color="white" if value is not None and value > middle else "black")
            if value is not None and found.target is not None and (
                    value <= found.target if found.at_most else value >= found.target):
                x0, x1 = _edges(bws)[j:j + 2]
                y0, y1 = _edges(lats)[i:i + 2]
                ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False,
                                       edgecolor="black", linewidth=2.5))
    ax.set_xticks(bws, [f"{b:g}" for b in bws])
    ax.set_yticks(lats, [f"{v:g}" for v in lats])
    ax.minorticks_off()
    ax.set_xlabel("WAN bandwidth per DC pair (Gbit/s)")
    ax.set_ylabel("WAN one-way latency (ms)")
    fig.colorbar(mesh, ax=ax, label=UNITS.get(unit, unit))
    up_to = found.frontier.up_to(found.target, found.at_most, "")
    target = "" if found.target is None else \
        f"; outlined: the target ({fmt(found.target, unit)}) reached"
    ax.set_title(wrap(f"{claim}: largest searched {fmt(up_to['value'], unit)}, at "
                      f"{up_to['conditions']}"
                      f"{target}", 80), fontsize=8)
    save_figure(fig, path)
    keys = list(Point(0, 0).as_dict())
    write_csv(beside(path), [*keys, "value", "why_none"],
              [(*p.as_dict().values(), f.get("value"), f.get("why_none"))
               for p, f in found.frontier.results.items()])


def loss_map_plot(cells: Sequence[Cell], title: str, path: Path) -> None:
    """The contender fastest to the target loss at each WAN latency x bandwidth, a shade
    per contender, its name and its margin (the runner-up's time over its own) written in;
    the CSV has every contender's time at every cell."""
    lats = sorted({c.point.latency_ms for c in cells})
    bws = sorted({c.point.bandwidth_gbit for c in cells})
    by = {(c.point.latency_ms, c.point.bandwidth_gbit): c for c in cells}
    names = sorted({e.policy for c in cells for e in c.entrants})
    shade = {name: i / max(1, len(names)) for i, name in enumerate(names)}
    values = [[shade[w.policy] if (w := by[(lat, bw)].winner) else math.nan for bw in bws]
              for lat in lats]
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    ax.pcolormesh(_edges(bws), _edges(lats), values, cmap="Greys", vmin=0, vmax=1.25,
                  shading="flat")
    log_axis(ax, "x")
    log_axis(ax, "y")
    for (lat, bw), cell in by.items():
        winner, margin = cell.winner, cell.margin
        text = "n/a" if winner is None else winner.policy + (
            f"\n{margin:.2f}x" if margin is not None else "") + (
            "*" if winner.extrapolated else "")
        dark = winner is not None and shade[winner.policy] > 0.55
        ax.text(bw, lat, text, ha="center", va="center", fontsize=7,
                color="white" if dark else "black")
    ax.set_xticks(bws, [f"{b:g}" for b in bws])
    ax.set_yticks(lats, [f"{v:g}" for v in lats])
    ax.minorticks_off()
    ax.set_xlabel("WAN bandwidth per DC pair (Gbit/s)")
    ax.set_ylabel("WAN one-way latency (ms)")
    target = with_target(cells)
    loss = "" if target is None else f" {target:.4g}"
    ax.set_title(wrap(f"{title}: fastest to loss{loss} (predicted; under the name, the "
                      f"runner-up's time over the winner's; * extrapolated). "
                      f"{summary(cells)}", 80), fontsize=8)
    save_figure(fig, path)
    rows = [row for cell in cells for row in cell.as_rows()]
    write_csv(beside(path), list(rows[0]) if rows else [], [tuple(r.values()) for r in rows])


def _edges(centers: Sequence[float]) -> list[float]:
    """Cell edges on a log axis: geometric midpoints, the outer ones mirrored."""
    if len(centers) == 1:
        return [centers[0] / 2, centers[0] * 2]
    mids = [math.sqrt(a * b) for a, b in itertools.pairwise(centers)]
    return [centers[0] ** 2 / mids[0], *mids, centers[-1] ** 2 / mids[-1]]


def load_plot(points: Sequence[LoadPoint], deadline_s: float | None, title: str,
              path: Path) -> None:
    """Against the arrival rate: GPU utilization, what became of the requests, and the
    time to first token (the deadline dotted)."""
    ok = [p for p in points if p.error is None]
    rates = [p.rate for p in ok]
    fig, axes = plt.subplots(3, 1, figsize=(6.4, 7.6), sharex=True)
    series = [
        (axes[0], "GPU utilization (%)", [
            ("training", [_pct(p.utilization_training) for p in ok]),
            ("training + prefills", [_pct(p.utilization_total) for p in ok])]),
        (axes[1], "share of requests (%)", [
            ("first token in time", [_share((p.served or 0) - (p.expired or 0), p)
                                     for p in ok]),
            ("first token late", [_share(p.expired or 0, p) for p in ok]),
            ("rejected", [_share(p.rejected, p) for p in ok]),
            ("waiting when the run ended", [_share(p.pending, p) for p in ok])]),
        (axes[2], "time to first token (s)", [
            ("p50", [p.ttft_p50_s for p in ok]), ("p99", [p.ttft_p99_s for p in ok])]),
    ]
    for ax, ylabel, lines in series:
        for i, (label, ys) in enumerate(lines):
            ax.plot(rates, [math.nan if y is None else y for y in ys], label=label,
                    **line_style(i))
        ax.set_ylabel(ylabel)
        ax.grid(True, color="0.85", which="both")
    if deadline_s is not None:
        axes[2].axhline(deadline_s, color="0.3", linestyle=":", linewidth=1,
                        label=f"deadline {deadline_s:g} s")
    for ax in axes:
        legend_beside(ax, fontsize=7)
    if spans_decade(y for p in ok for y in (p.ttft_p50_s, p.ttft_p99_s)):
        log_axis(axes[2], "y")
    if spans_decade(rates):
        log_axis(axes[2], "x")
    axes[2].set_xlabel("prefill requests arriving per second")
    axes[0].set_title(wrap(title, 80), fontsize=9)
    save_figure(fig, path)
    write_csv(beside(path), ["requests_per_s", "utilization_training", "utilization_total",
                             "arrived", "served", "expired", "rejected", "served_share",
                             "ttft_p50_s", "ttft_p99_s", "slowdown_percent", "error"],
              [(p.rate, p.utilization_training, p.utilization_total, p.arrived, p.served,
                p.expired, p.rejected, p.served_share, p.ttft_p50_s, p.ttft_p99_s,
                p.slowdown, p.error) for p in points])


def _pct(value: float | None) -> float | None:
    return None if value is None else 100 * value


def _share(count: int | None, point: LoadPoint) -> float | None:
    return None if count is None or not point.arrived else 100 * count / point.arrived
