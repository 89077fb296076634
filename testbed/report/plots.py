"""Plots (PNG, matplotlib, readable in black and white: markers and hatches, not colors)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

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
    fig.savefig(path, dpi=120)
    plt.close(fig)
