"""What every plot of ours shares, so that each can go into a paper as it is: the format
(PNG, PDF or SVG, by the file's suffix), nothing clipped, a CSV of the plotted numbers
beside the picture, line styles and markers that stay apart in black and white, a
log axis where the values span more than a decade (with points on it, never bars: a log
axis has no zero for a bar to start from), and legends beside the axes, not over the
data."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from testbed.common.choices import FigureFormat
from testbed.common.fsutil import atomic_output, write_atomic

FORMATS: tuple[FigureFormat, ...] = ("png", "pdf", "svg")
DPI = 150
WIDE = 10.0
"""Decades past which an axis goes logarithmic: values spanning more than this factor."""


def save_figure(fig: Any, path: Path) -> None:
    """Write a figure in the format its suffix names (never through a link there:
    testbed.common.fsutil), cropped to what it draws so no title or label is cut, and close it."""
    fmt = path.suffix.lstrip(".")
    if fmt not in FORMATS:
        raise ValueError(f"{path}: figures are {', '.join(FORMATS)}")
    try:
        with atomic_output(path) as handle:
            fig.savefig(handle, format=fmt, dpi=DPI, bbox_inches="tight", pad_inches=0.05)
    finally:
        plt.close(fig)


def write_csv(path: Path, header: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """The numbers a figure plots, one line per point (empty for none)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(["" if v is None else v for v in row] for row in rows)
    write_atomic(path, out.getvalue(), 0o644)


def beside(path: Path) -> Path:
    """The CSV that goes with a figure: the same name, .csv."""
    return path.with_suffix(".csv")


MARKERS = ("o", "s", "^", "D", "v", "x", "*", "P", "<", ">", "h", "+")
DASHES: tuple[Any, ...] = ("-", "--", ":", "-.", (0, (5, 1, 1, 1, 1, 1)),
                           (0, (8, 2)), (0, (1, 3)), (0, (3, 1, 3, 1, 1, 1)))


def line_style(i: int) -> dict[str, Any]:
    """The i-th series' marker and dash pattern: no two of the first 96 alike (markers
    and dashes run through different cycles). Keyword arguments of matplotlib's plot."""
    return {"color": "black", "marker": MARKERS[i % len(MARKERS)],
            "linestyle": DASHES[(i + i // len(MARKERS)) % len(DASHES)]}


def spans_decade(values: Iterable[float | None]) -> bool:
    """Whether positive values span more than a factor of ten (a log axis shows both
    ends); False when any is zero or negative, where a log axis cannot."""
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return bool(kept) and min(kept) > 0 and max(kept) / min(kept) > WIDE


def log_axis(ax: Any, axis: Literal["x", "y"]) -> None:
    """A logarithmic axis whose ticks read as plain numbers (0.05, 2, 300), not powers."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    getattr(ax, f"set_{axis}scale")("log")
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    target.set_minor_formatter(FuncFormatter(lambda _v, _pos: ""))


def legend_beside(ax: Any, **options: Any) -> None:
    """The axes' legend to their right, outside them, where it covers no data (the saved
    figure grows to hold it: save_figure)."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0,
              **{"fontsize": 8, **options})


def wrap(text: str, width: int = 70) -> str:
    """A title on as many lines as it needs, so the figure never crops it."""
    import textwrap

    return "\n".join(textwrap.wrap(text, width)) or text
