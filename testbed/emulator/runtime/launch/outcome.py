"""A launch's files: results.json (its own kind, testbed.report.launch_results), a
Perfetto trace of link use and of the ranks' lives, the WAN plot (and the loss plot
where the program reported a loss), and the topology it ran on."""

from __future__ import annotations

import contextlib
from pathlib import Path

from testbed.common.choices import FigureFormat
from testbed.common.codec import to_json
from testbed.common.fsutil import write_atomic
from testbed.common.yamlio import to_yaml
from testbed.emulator.runtime.launch.counters import link_header
from testbed.emulator.runtime.launch.launcher import LaunchRun
from testbed.emulator.runtime.launch.metric_lines import launch_loss_curve
from testbed.emulator.runtime.launch.rank_process import exit_signal
from testbed.metrics.link_counters import (
    ETHERNET_HEADER_BYTES,
    DirectionUse,
    direction_use,
    total_utilization,
    utilization_series,
)
from testbed.metrics.link_use import LinkUse as UseOverTime
from testbed.metrics.loss import time_to_loss
from testbed.report.chrome import TraceEvent, write_trace
from testbed.report.figure_files import write_csv
from testbed.report.launch_results import (
    LAUNCH_SCHEMA_VERSION,
    LaunchClock,
    LaunchCluster,
    LaunchResults,
    LaunchWan,
    LinkUse,
    RankOutcome,
)
from testbed.report.plots import WanPanel, loss_plot, wan_plot
from testbed.report.results import strict_json, versions
from testbed.report.run_results import Versions
from testbed.scenario.reach import applied_results, entries, reach
from testbed.topology.load import dump_topology

CLOCK = LaunchClock(
    compute="this machine's: the program's own compute, at this machine's speed, unscaled",
    network="real time: the emulated WAN's latencies and rates as the topology gives them",
    dilation=1)
TRACE = "trace.json.gz"
COUNTERS = "counters.csv"
"""Every sample of every direction's counters, as read (cumulative since the shaper was
made): for what happened between two moments of the program's."""


def directions(run: LaunchRun) -> list[DirectionUse]:
    """Each direction this machine shapes, from its counters."""
    if run.network is None or run.sampler is None:
        return []
    rates = {}
    for link in run.spec.topology.links:
        rates[f"{link.a}>{link.b}"] = rates[f"{link.b}>{link.a}"] = link.bandwidth_bps
    header = link_header(run.network)
    return [direction_use(link, samples, rates.get(link, 0.0), header)
            for link, samples in sorted(run.sampler.samples.items())]


def launch_results(run: LaunchRun, uses: list[DirectionUse]) -> LaunchResults:
    spec = run.spec
    length = run.end_s
    links = [LinkUse(u.link, u.rate_bps, u.payload_bytes, u.wire_bytes, u.packets, u.drops,
                     u.peak_bps, u.peak_utilization(), u.mean_utilization(length))
             for u in uses]
    peaks = [p for u in uses if (p := u.peak_utilization()) is not None]
    wan = LaunchWan(sum(u.payload_bytes for u in uses), sum(u.wire_bytes for u in uses),
                    total_utilization(uses, length), max(peaks) if peaks else None,
                    spec.sample_s, links, run.sampler.error if run.sampler else None)
    outcomes = []
    for rank in run.ranks:
        code = rank.process.returncode if rank.process is not None else None
        end = (rank.ended or rank.started) - rank.started
        outcomes.append(RankOutcome(
            rank.seat.index, rank.seat.host, rank.seat.dc, list(rank.seat.gpus),
            rank.end or "stopped", code, exit_signal(code), round(end, 3),
            rank.cpu_s(run.groups), rank.peak_memory or None,
            str(rank.log_path.relative_to(spec.out)),
            rank.restarts if spec.torchrun else None,
            sorted(rank.torch_ranks) if spec.torchrun or spec.per == "dc" else None))
    curve = launch_loss_curve(run.metrics)
    reached = reach(entries(spec.events, spec.scenario), length, run.lost)
    applied = applied_results(spec.events, spec.scenario, reached)
    return LaunchResults(
        LAUNCH_SCHEMA_VERSION, "launch", spec.topology.name, list(spec.command), spec.per,
        spec.torchrun, spec.placement, list(spec.hosts), run.master,
        run.network.shaper.value if run.network else None, run.status, run.error,
        round(length, 3) if run.ranks else None, CLOCK, wan, outcomes,
        sorted(run.metrics, key=lambda p: (p["time_s"], p["rank"])), curve,
        None if spec.target_loss is None else time_to_loss(
            curve or [], spec.target_loss,
            None if curve else "the program reported no loss (a `loss` in its metric "
            "lines)"),
        applied.events, applied.scenario, Versions(**versions()),
        None if spec.cluster is None else _cluster(spec.cluster.name, spec.machine,
                                                   run.machines))


def _cluster(name: str, machine: str | None, machines: dict[str, str]) -> LaunchCluster:
    out: LaunchCluster = {"name": name, "machine": machine}
    if machines:
        out["machines"] = machines
    return out


def trace_events(run: LaunchRun, uses: list[DirectionUse]) -> list[TraceEvent]:
    """Link rates as counter tracks (Mbit/s), each rank's life as a span, each lost host
    and link change as an instant; microseconds from the launch's start."""
    out: list[TraceEvent] = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "WAN"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "ranks"}}]
    for use in uses:
        out += [{"ph": "C", "name": use.link, "pid": 1, "ts": round(t * 1e6),
                 "args": {"Mbit/s": round(bps / 1e6, 3)}}
                for t, bps in zip(use.times, use.bps, strict=True)]
    for rank in run.ranks:
        out.append({"ph": "M", "name": "thread_name", "pid": 2, "tid": rank.seat.index + 1,
                    "args": {"name": f"{rank.name} {rank.seat.host}"}})
        code = rank.process.returncode if rank.process is not None else None
        begin = rank.started - run.origin
        out.append({"ph": "X", "name": f"{rank.name} ({rank.end}, exit {code})",
                    "cat": "rank", "pid": 2, "tid": rank.seat.index + 1,
                    "ts": round(begin * 1e6),
                    "dur": round(((rank.ended or rank.started) - rank.started) * 1e6),
                    "args": {"host": rank.seat.host, "exit_code": code, "end": rank.end}})
    for gpu, at in run.lost:
        out.append({"ph": "i", "s": "g", "name": f"host {gpu} lost", "pid": 2,
                    "ts": round(at * 1e6)})
    for at, link in run.applied_changes:
        out.append({"ph": "i", "s": "p", "name": f"link change {link}", "pid": 1,
                    "ts": round(at * 1e6)})
    for point in run.metrics:
        if point["values"].get("loss") is not None:
            out.append({"ph": "C", "name": f"loss rank {point['rank']}", "pid": 2,
                        "ts": round(point["time_s"] * 1e6),
                        "args": {"loss": point["values"]["loss"]}})
    return out


def write_launch(run: LaunchRun) -> LaunchResults:
    """Every file; results.json last, so that its presence means the rest are there."""
    out = run.spec.out
    out.mkdir(parents=True, exist_ok=True)
    uses = directions(run)
    results = launch_results(run, uses)
    write_atomic(out / "topology.yaml", to_yaml(dump_topology(run.spec.topology)), 0o644)
    write_trace(out / TRACE, iter(trace_events(run, uses)))
    if run.sampler is not None:
        write_csv(out / COUNTERS, ["time_s", "link", "bytes", "packets", "drops"],
                  [(round(c.t, 6), link, c.bytes, c.packets, c.drops)
                   for link, samples in sorted(run.sampler.samples.items()) for c in samples])
    draw(out, run.spec.topology.name, uses, results)
    write_atomic(out / "results.json", strict_json(to_json(results), indent=True), 0o644)
    return results


def redraw(run_dir: Path, out: Path, fmt: FigureFormat = "png") -> LaunchResults:
    """A launch's plots again, from its results.json and counters.csv."""
    import csv

    from testbed.common.codec import from_json
    from testbed.common.jsonio import read_json
    from testbed.metrics.link_counters import Counter
    from testbed.report.results_schema import check_results

    source = run_dir / "results.json"
    data = read_json(source)
    check_results(data, str(source))
    results: LaunchResults = from_json(data, LaunchResults, str(source))
    samples: dict[str, list[Counter]] = {}
    with contextlib.suppress(FileNotFoundError), open(run_dir / COUNTERS) as handle:
        for row in csv.DictReader(handle):
            samples.setdefault(row["link"], []).append(Counter(
                float(row["time_s"]), int(row["bytes"]), int(row["packets"]),
                int(row["drops"])))
    header = ETHERNET_HEADER_BYTES if results.shaper == "netem" else 0
    rates = {link.link: link.rate_bps for link in results.wan.links}
    uses = [direction_use(link, found, rates.get(link, 0.0), header)
            for link, found in sorted(samples.items())]
    draw(out, results.topology, uses, results, fmt)
    return results


def draw(out: Path, title: str, uses: list[DirectionUse], results: LaunchResults,
         fmt: FigureFormat = "png") -> None:
    """wan.png (each direction's share of its rate over time) and, with a loss, loss.png."""
    series = utilization_series(uses)
    times = next((u.times for u in uses if u.times), [])
    length = results.wall_s or (times[-1] if times else 1.0)
    use = UseOverTime(times, {k: v for k, v in series.items()
                              if len(v) == len(times) and any(b > 0 for b in v)})
    wan_plot([WanPanel(f"{title}: {' '.join(results.command)[:60]}", use, length or 1.0)],
             out / f"wan.{fmt}")
    if results.loss_curve:
        loss_plot([("launch", results.loss_curve)], out / f"loss.{fmt}",
                  results.time_to_loss["target"] if results.time_to_loss else None)
