"""Figures a paper can take: numeric and log axes where values call for them, line styles
that stay apart, one time scale across Gantt panels with rows in pipeline order and
prefills on top, a CSV beside every figure, PDF and SVG."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from testbed.report import gantt, plots
from testbed.report.compare import Row
from testbed.report.figure_files import line_style, save_figure, spans_decade
from testbed.report.gantt import GanttPanel, gantt_plot, pipeline_order


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the plot functions make, kept open instead of written (the CSVs are
    still written)."""
    kept: list[Any] = []
    for module in (plots, gantt):
        monkeypatch.setattr(module, "save_figure", lambda fig, _path: kept.append(fig))
    return kept


def test_line_styles_stay_apart_and_log_axes_need_a_decade() -> None:
    styles = {(s["marker"], str(s["linestyle"])) for s in map(line_style, range(96))}
    assert len(styles) == 96
    assert spans_decade([0.5, 6.0]) and not spans_decade([1.0, 9.0])
    assert not spans_decade([0.0, 100.0]) and not spans_decade([])


def test_swept_rates_are_placed_in_their_own_units() -> None:
    """Bandwidths in Gbit/s whichever way they are written; arrival rates per second
    (they were read as bits per second and labelled Gbit/s)."""
    assert plots.axis_values("wan.bandwidth", ["1.25GB/s", "10Gbit", "500Mbps"]) == \
        ([10.0, 10.0, 0.5], "wan.bandwidth (Gbit/s)")
    assert plots.axis_values("inference.arrival_rate", ["20/s", "1200/min", "50"]) == \
        ([20.0, 20.0, 50.0], "inference.arrival_rate (per s)")
    assert plots.axis_values("wan.bandwidth", ["10mbps"]) is None


def test_sweep_axes_are_numeric_and_logarithmic_over_decades(drawn: list[Any],
                                                             tmp_path: Path) -> None:
    rows = [{"policy": p, "wan.bandwidth": bw, "iteration_s": s}
            for p, scale in (("gpipe", 1.0), ("atlas", 40.0))
            for bw, s in (("100Mbit", 9.0 * scale), ("1Gbit", 3.0 * scale),
                          ("100Gbit", 1.0 * scale))]
    plots.sweep_plot(rows, ["wan.bandwidth"], tmp_path / "sweep.png")
    ax = drawn[0].axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "Gbit/s" in ax.get_xlabel()
    xs = sorted(ax.lines[0].get_xdata())
    assert xs == pytest.approx([0.1, 1.0, 100.0])  # where the rates are, not 0, 1, 2
    assert ax.lines[0].get_marker() != ax.lines[1].get_marker()


def _row(combo: str, seconds: float) -> Row:
    return Row(combo, 1, 0, seconds, seconds * 0.9, seconds * 1.1, None, None, None, None,
               None, None, None, None)


def test_iterations_go_logarithmic_when_one_is_ten_times_another(drawn: list[Any],
                                                                  tmp_path: Path) -> None:
    plots.iteration_plot([_row("a", 1.0), _row("b", 30.0)], tmp_path / "iterations.png")
    plots.iteration_plot([_row("a", 1.0), _row("b", 3.0)], tmp_path / "again.png")
    assert drawn[0].axes[0].get_yscale() == "log"
    assert drawn[1].axes[0].get_yscale() == "linear"
    rows = list(csv.DictReader((tmp_path / "iterations.csv").open()))
    assert [(r["policy"], float(r["iteration_s"])) for r in rows] == [("a", 1.0), ("b", 30.0)]


def _span(gpu: str, kind: str, start: float, end: float, **extra: Any) -> dict[str, Any]:
    return {"gpu": gpu, "kind": kind, "start": start, "end": end, **extra}


def test_gantt_rows_in_pipeline_order_one_time_scale_prefills_on_top(
        drawn: list[Any], tmp_path: Path) -> None:
    placement = {"0,0": ["west-0"], "0,1": ["east-1"], "1,0": ["east-0"], "1,1": ["west-1"]}
    assert pipeline_order(["east-0", "east-1", "west-0", "west-1", "x-0"], placement) == \
        ["west-0", "east-1", "east-0", "west-1", "x-0"]
    short = [_span("east-0", "forward", 0.0, 1.0), _span("east-0", "step", 1.0, 2.0,
                                                         iteration=0)]
    long = [_span("west-0", "recv", 0.0, 8.0), _span("west-0", "prefill", 1.0, 3.0),
            _span("west-0", "backward", 8.0, 9.0),
            _span("west-0", "step", 9.0, 10.0, iteration=0)]
    gantt_plot([GanttPanel("fast", short, 0.0, 0, {"0,0": ["east-0"]}),
                GanttPanel("slow", long, 0.0, 0, {"0,0": ["west-0"]})],
               tmp_path / "gantt.png")
    fast, slow = drawn[0].axes[:2]
    assert fast.get_xlim() == slow.get_xlim() == (0.0, 10.0)
    layers = {c.get_zorder(): c for c in slow.collections}
    prefill = next(c for c in slow.collections if c.get_hatch() == "oo")
    recv = next(c for c in slow.collections if c.get_hatch() == "..")
    assert prefill.get_zorder() > recv.get_zorder() and len(layers) == 3
    bars = list(csv.DictReader((tmp_path / "gantt.csv").open()))
    assert [(b["policy"], b["kind"]) for b in bars if b["gpu"] == "west-0"][:2] == [
        ("slow: iteration 1", "recv"), ("slow: iteration 1", "prefill")]


@pytest.mark.parametrize("fmt", ["pdf", "svg"])
def test_figures_are_written_in_the_format_their_name_says(tmp_path: Path, fmt: str) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set_title("a title long enough to run past the axes on either side of them " * 2)
    save_figure(fig, tmp_path / f"plot.{fmt}")
    head = (tmp_path / f"plot.{fmt}").read_bytes()[:5]
    assert head == (b"%PDF-" if fmt == "pdf" else b"<?xml")
    with pytest.raises(ValueError, match="figures are png, pdf, svg"):
        save_figure(plt.figure(), tmp_path / "plot.jpg")


def test_compare_draws_in_the_format_asked_with_a_csv_beside_each(tmp_path: Path) -> None:
    from .test_cli import call

    out = tmp_path / "cmp"
    code, _, err = call(["compare", str(Path(__file__).parent.parent / "topologies" /
                                         "two-dc.yaml"), "-p", "gpipe", "-p", "1f1b",
                         "--format", "svg", "--out", str(out)])
    assert code == 0, err
    for name in ("iterations", "gantt", "wan"):
        assert (out / f"{name}.svg").read_text().startswith("<?xml"), name
        assert (out / f"{name}.csv").read_text().count("\n") > 1, name
        assert not (out / f"{name}.png").exists()
    code, _, err = call(["report", str(out), "--format", "pdf"])
    assert code == 0, err
    assert (out / "gantt.pdf").read_bytes().startswith(b"%PDF-")
