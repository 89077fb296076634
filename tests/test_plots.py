"""Figures a paper can take: numeric and log axes where values call for them, line styles
that stay apart, one time scale across Gantt panels with rows in pipeline order and
prefills on top, a CSV beside every figure, PDF and SVG."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from matplotlib.patches import Rectangle

from testbed.figures import charts
from testbed.metrics.link_use import carried, link_transfers, link_use, routes
from testbed.report import gantt, plots
from testbed.report.figure_files import line_style, save_figure, spans_decade
from testbed.report.gantt import GanttPanel, gantt_plot, pipeline_order
from testbed.report.plots import Throughput, WanPanel


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The figures the plot functions make, kept open instead of written (the CSVs are
    still written)."""
    kept: list[Any] = []
    for module in (plots, gantt, charts):
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


def test_throughput_is_points_never_bars_and_goes_logarithmic_over_a_decade(
        drawn: list[Any], tmp_path: Path) -> None:
    wide = [Throughput("a", 100.0, 90.0, 110.0, 1.0), Throughput("b", 3000.0, 2900.0, 3100.0,
                                                                 30.0)]
    plots.throughput_plot(wide, tmp_path / "throughput.png")
    plots.throughput_plot([Throughput("a", 100.0, 90.0, 110.0), Throughput("b", 300.0, 300.0,
                                                                           300.0)],
                          tmp_path / "again.png", target=2.5)
    log, linear = drawn[0].axes[0], drawn[1].axes[0]
    assert log.get_xscale() == "log" and linear.get_xscale() == "linear"
    assert linear.get_xlim()[0] == 0
    for ax in (log, linear):
        assert not _bars(ax) and ax.get_xlabel() == "training throughput (tokens/s)"
    assert [t.get_text() for t in log.get_yticklabels()] == ["a", "b"]
    assert len(drawn[1].axes) == 2 and drawn[1].axes[1].get_xlabel() == "time to loss 2.5 (s)"
    rows = list(csv.DictReader((tmp_path / "throughput.csv").open()))
    assert [(r["policy"], float(r["tokens_per_s"]), float(r["max"])) for r in rows] == [
        ("a", 100.0, 110.0), ("b", 3000.0, 3100.0)]


def _bars(ax: Any) -> list[Any]:
    """The bars an axes draws (its background is not one)."""
    return [p for p in ax.patches if isinstance(p, Rectangle)]


def _legends_off_the_data(fig: Any) -> None:
    """No legend of `fig` overlaps the inside of any of its axes."""
    fig.canvas.draw()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()] + list(fig.legends)
    assert legends
    for legend in legends:
        box = legend.get_window_extent()
        for ax in fig.axes:
            inside = ax.get_window_extent()
            assert not box.overlaps(inside), (legend, ax.get_title())


def test_link_use_never_shows_more_than_the_link_carried() -> None:
    """Two transfers that shared a 1 Gbit/s link for a second and each ran alone for one
    (A alone, both, B alone: 187.5 MB each) carried the link full for three seconds;
    spread evenly over their spans they add up to 150% while both run."""
    rate, full = 1e9, 125e6
    spans = [_span("x", "transfer", 0.0, 2.0, link="a>b", bytes=int(1.5 * full)),
             _span("y", "transfer", 1.0, 3.0, link="a>b", bytes=int(1.5 * full)),
             _span("z", "transfer", 5.0, 6.0, link="a>b", bytes=int(0.25 * full))]
    use = link_use(spans, 0.0, 6.0, {"a>b": rate}, bins=6)
    assert use.times == pytest.approx([0.5, 1.5, 2.5, 3.5, 4.5, 5.5])
    assert use.utilization["a>b"] == pytest.approx([1.0, 1.0, 1.0, 0.0, 0.0, 0.25], abs=1e-5)
    edges, carried_bytes = carried([(0.0, 2.0, 1.5 * full), (1.0, 3.0, 1.5 * full)], rate)
    assert carried_bytes.sum() == pytest.approx(3 * full)  # every byte kept
    assert list(edges) == [0.0, 1.0, 2.0, 3.0]


def test_a_zero_byte_transfer_beside_a_full_link_leaves_no_nan() -> None:
    """An empty transfer (a zero-length payload) overlapping others while the link is
    over-full: scaling its share back to its bytes divided zero by zero."""
    full = 125e6
    _, carried_bytes = carried([(0.0, 2.0, 3 * full), (0.5, 1.0, 0.0),
                                    (1.0, 3.0, 1.5 * full)], 1e9)
    assert np.isfinite(carried_bytes).all()
    assert carried_bytes.sum() == pytest.approx(4.5 * full)


def test_link_use_counts_a_routed_transfer_on_each_link_it_crosses() -> None:
    route = routes({("a", "c"): ["a", "b", "c"], ("a", "b"): ["a", "b"]})
    assert route == {"a>c": ("a>b", "b>c"), "a>b": ("a>b",)}
    spans = [_span("x", "transfer", 0.0, 1.0, link="a>c", bytes=10),
             _span("x", "transfer", 0.0, 1.0, link=None, bytes=10)]  # inside a DC
    assert link_transfers(spans, route) == {"a>b": [(0.0, 1.0, 10.0)],
                                            "b>c": [(0.0, 1.0, 10.0)]}


def test_link_use_above_the_rate_only_where_an_event_raised_it() -> None:
    spans = [_span("x", "transfer", 0.0, 1.0, link="a>b", bytes=250_000_000)]  # 2 Gbit/s
    raised = link_use(spans, 0.0, 1.0, {"a>b": 1e9}, peaks={"a>b": 2e9}, bins=1)
    assert raised.utilization["a>b"] == pytest.approx([2.0])


def test_wan_panels_each_on_its_own_time_scale_within_the_rate(drawn: list[Any],
                                                               tmp_path: Path) -> None:
    spans = [_span("x", "transfer", 0.0, 2.0, link="a>b", bytes=187_500_000),
             _span("y", "transfer", 1.0, 3.0, link="a>b", bytes=187_500_000)]
    long = [_span("x", "transfer", 0.0, 3000.0, link="a>b", bytes=10**9),
            _span("x", "forward", 3000.0, 3100.0)]
    panels = [WanPanel(title, link_use(s, 0.0, end, {"a>b": 1e9}), end)
              for title, s, end in (("short", spans, 3.0), ("long", long, 3100.0))]
    plots.wan_plot(panels, tmp_path / "wan.png")
    short, far = drawn[0].axes
    assert short.get_xlim() == (0.0, 3.0) and far.get_xlim() == (0.0, 3100.0)
    assert max(max(line.get_ydata()) for line in short.lines) <= 1 + 1e-6
    _legends_off_the_data(drawn[0])
    assert max(float(r["utilization"]) for r in csv.DictReader(
        (tmp_path / "wan.csv").open())) <= 1 + 1e-6


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
    legend = drawn[0].legends[0]  # the kinds drawn, and only those
    assert [t.get_text() for t in legend.get_texts()] == [
        "forward", "backward", "step", "recv", "prefill"]
    assert {b["kind"] for b in bars} == {"forward", "backward", "step", "recv", "prefill"}
    _legends_off_the_data(drawn[0])


def test_gantt_legend_says_which_kinds_are_too_short_to_see(drawn: list[Any],
                                                             tmp_path: Path) -> None:
    spans = [_span("e-0", "forward", 0.0, 1e-6), _span("e-0", "recv", 1e-6, 1.0),
             _span("e-0", "step", 1.0, 1.0 + 1e-6, iteration=0)]
    gantt_plot([GanttPanel("p", spans, 0.0, 0)], tmp_path / "gantt.png")
    assert [t.get_text() for t in drawn[0].legends[0].get_texts()] == [
        "forward (too short to see)", "step (too short to see)", "recv"]


def test_claims_on_a_log_axis_are_points_not_bars_legends_off_the_data(
        drawn: list[Any], tmp_path: Path) -> None:
    transfer = {"connections": 32, "one_connection_s": 0.38, "many_connections_s": 0.047}
    record: Any = {"id": "multi_tcp:x", "claim": "Multiple TCP connections", "paper":
                   "up to 20x", "unit": "x", "target": 20, "at_most": False,
                   "conditions": "x.yaml", "up_to": None,
                   "detail": {"simulate": {"value": 8.1, "runs": {"transfer": transfer}}}}
    charts.claim_plot(record, tmp_path / "claim.png")
    ax = drawn[0].axes[0]
    assert ax.get_yscale() == "log" and not _bars(ax)  # 0.38 s to a 0.019 s target line
    assert list(ax.lines[0].get_ydata()) == [0.38, 0.047]
    _legends_off_the_data(drawn[0])
    transfer["one_connection_s"] = 0.09  # within a decade of the rest: bars from zero
    record["target"] = 2
    charts.claim_plot(record, tmp_path / "claim.png")
    ax = drawn[1].axes[0]
    assert ax.get_yscale() == "linear" and len(_bars(ax)) == 2 and ax.get_ylim()[0] == 0


def test_sweep_and_loss_legends_sit_beside_the_axes(drawn: list[Any], tmp_path: Path) -> None:
    rows = [{"policy": p, "wan.latency": f"{ms}ms", "iteration_s": ms * k}
            for p, k in (("gpipe", 1.0), ("atlas", 0.5)) for ms in (10, 20, 40)]
    plots.sweep_plot(rows, ["wan.latency"], tmp_path / "sweep.png")
    curve: Any = [{"iteration": i, "time_s": float(i), "tokens": i, "loss": 5.0 - i}
                  for i in range(5)]
    plots.loss_plot([("a", curve), ("b", curve[:3])], tmp_path / "loss.png", 2.0)
    for fig in drawn:
        _legends_off_the_data(fig)


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
    for name in ("throughput", "gantt", "wan"):
        assert (out / f"{name}.svg").read_text().startswith("<?xml"), name
        assert (out / f"{name}.csv").read_text().count("\n") > 1, name
        assert not (out / f"{name}.png").exists()
    code, _, err = call(["report", str(out), "--format", "pdf"])
    assert code == 0, err
    assert (out / "gantt.pdf").read_bytes().startswith(b"%PDF-")


def test_a_link_is_held_to_a_raised_rate_only_where_an_event_or_trace_raised_it() -> None:
    from testbed.report.run_plots import raised_rates
    from testbed.topology import load_topology
    from testbed.topology.net_events import NetEvent

    topology = load_topology(Path(__file__).parent.parent / "topologies" / "two-dc.yaml")
    events = [NetEvent(1.0, "east", "west", "bandwidth", 2e9, 3.0).as_raw(),
              NetEvent(2.0, "east", "west", "bandwidth", 5e8, None).as_raw(),
              NetEvent(3.0, "east", "west", "down", 1.0, 1.0).as_raw()]
    assert raised_rates(topology, {"events": events[1:]}) == {}  # lowered: 1 Gbit/s holds
    traces = [{"link": "west>east", "bandwidth": {"min": 1e8, "max": 3e9}}]
    assert raised_rates(topology, {"events": events, "scenario": {"traces": traces}}) == {
        "east>west": 2e9, "west>east": 3e9}
