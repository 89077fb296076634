"""The plots drawn from runs' files, for one run (`testbed show`) or for the first run of
each policy combination in a comparison (`testbed compare`, `testbed report`): a Gantt
chart of one iteration, WAN use over time, and loss against time where a run measured
it. Each in the format asked, with its CSV beside it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from testbed.common.choices import FigureFormat
from testbed.common.codec import JsonObject
from testbed.metrics.link_use import link_use, routes
from testbed.report.gantt import GanttPanel, gantt_plot
from testbed.report.plots import WanPanel, loss_plot, wan_plot
from testbed.report.saved import SavedRun
from testbed.topology.model import Topology
from testbed.topology.net_events import parse_events


def link_rates(topology: Topology) -> dict[str, float]:
    """Each WAN link direction's rate (bit/s) as the topology gives it."""
    rates: dict[str, float] = {}
    for link in topology.links:
        rates[f"{link.a}>{link.b}"] = rates[f"{link.b}>{link.a}"] = link.bandwidth_bps
    return rates


def raised_rates(topology: Topology, results: JsonObject, source: str = "results.json"
                 ) -> dict[str, float]:
    """Link directions a network event or a scenario's trace gave a rate above the
    topology's during the run: the highest it had (the one real cause for a link to show
    more than 100% of its rate). `results`: results.json as read (SavedRun.results: raw,
    as one written before the schema is read too)."""
    rates = link_rates(topology)
    peaks: dict[str, float] = {}

    def raise_to(a: str, b: str, bps: float, one_way: bool) -> None:
        for key in [f"{a}>{b}"] if one_way else [f"{a}>{b}", f"{b}>{a}"]:
            if bps > max(rates.get(key, 0.0), peaks.get(key, 0.0)):
                peaks[key] = bps

    given = [{k: v for k, v in e.items() if k != "applied"}  # as the topology wrote it
             for e in results.get("events") or [] if isinstance(e, dict)
             and e.get("applied") is not False]
    for event in parse_events(given, topology, source):
        if event.kind == "bandwidth":
            raise_to(event.a, event.b, event.value, event.one_way)
    for trace in (results.get("scenario") or {}).get("traces") or []:
        a, arrow, b = str(trace["link"]).partition(">")
        if not arrow:
            a, _, b = str(trace["link"]).partition("-")
        if trace.get("bandwidth"):
            raise_to(a, b, float(trace["bandwidth"]["max"]), bool(arrow))
    return peaks


def wan_panel(run: SavedRun, topology: Topology) -> WanPanel:
    """A run's WAN use over its whole length, each transfer on the links of its route."""
    names = [dc.name for dc in topology.datacenters]
    route = routes({(a, b): topology.path(a, b) for a in names for b in names if a != b})
    raised = raised_rates(topology, run.results, run.source)
    length = run.length_s or 1.0
    use = link_use(run.spans, run.start, run.start + length, link_rates(topology), route,
                   raised)
    return WanPanel(run.title, use, length, raised)


def gantt_panel(run: SavedRun) -> GanttPanel:
    """The run's second iteration (the first warms up), or its only one."""
    done = len(run.results["iteration_time_s"]["all"])
    placement = (run.results.get("plan") or {}).get("placement") or {}
    return GanttPanel(run.title, run.spans, run.start, 1 if done > 1 else 0, placement)


def draw_runs(runs: Sequence[SavedRun], topology: Topology, directory: Path,
              fmt: FigureFormat = "png", target: float | None = None) -> list[Path]:
    """gantt, wan and, where a run measured its loss, loss (the target dotted) in
    `directory`; the files written."""
    written: list[Path] = []
    if runs:
        gantt_plot([gantt_panel(run) for run in runs], directory / f"gantt.{fmt}")
        wan_plot([wan_panel(run, topology) for run in runs], directory / f"wan.{fmt}")
        written += [directory / f"gantt.{fmt}", directory / f"wan.{fmt}"]
    curves = [(run.title, run.results["loss_curve"]) for run in runs
              if run.results.get("loss_curve")]
    if curves:
        loss_plot(curves, directory / f"loss.{fmt}", target)
        written.append(directory / f"loss.{fmt}")
    return written
