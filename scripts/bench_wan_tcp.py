#!/usr/bin/env python3
"""Where real TCP's slow starts stop in an emulated run, beside where the model's do. Rows of
the fidelity table, each run once under `testbed up`, each WAN connection's TCP state as
its kernel left it when training ended (results.json's `wan_connections`: window, slow-start
threshold, segments sent again), beside the same rows under `testbed simulate` (the model's
pairs at the end: the thresholds a full queue's losses set, testbed.sim.pair_states) and
what the simulator's connection keeps in flight before any loss (its buffers' window,
testbed.plan.tcp_model.in_flight_bytes): a real connection's threshold below it caps each
of its later slow starts after an idle.

Run as root: `.venv/bin/python scripts/bench_wan_tcp.py [--rows paper-3dc:1f1b,...]
[--iterations 4] [--json benchmarks/wan-tcp.json]`; `--resimulate` runs only the simulated
side again, at this commit, keeping the report's emulated runs (no root needed). Prints a
markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from measured_at import commit

from testbed.experiments.inputs import load_inputs
from testbed.plan.tcp_model import MSS, in_flight_bytes
from testbed.topology import Topology

ROOT = Path(__file__).resolve().parent.parent
ROWS = ("paper-3dc:gpipe", "paper-3dc:1f1b", "wan-3dc:1f1b", "detour-3dc:1f1b",
        "detour-3dc-direct:1f1b", "detour-3dc-deep:1f1b")
"""The fidelity table's rows whose baselines share WAN links (fair-shared pipelines)."""


def topology_file(name: str) -> Path:
    for folder in (ROOT / "topologies", ROOT / "scripts" / "fidelity_topologies"):
        if (folder / f"{name}.yaml").exists():
            return folder / f"{name}.yaml"
    raise SystemExit(f"bench_wan_tcp: no topology {name!r} in topologies/ or "
                     "scripts/fidelity_topologies/")


def model_window_segments(topology: Topology, host: str, peer: str) -> float:
    """What the simulator's connection from `host` to `peer` keeps in flight, in segments
    (testbed.sim.flows.pair_between's window)."""
    src, dst = host.rsplit("-", 1)[0], peer.rsplit("-", 1)[0]
    slowest = topology.bottlenecks(src, dst)
    return in_flight_bytes(topology.tcp_for(src), topology.tcp_for(dst),
                           slowest[0].bandwidth_bps if slowest else None) / MSS


def testbed_results(command: str, name: str, policy: str, iterations: int) -> dict[str, Any]:
    """`testbed COMMAND` on the row's topology; its results.json."""
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "testbed"), command,
             str(topology_file(name)), "-p", policy, "--iterations", str(iterations),
             "--out", f"{tmp}/run"], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"bench_wan_tcp: {name}:{policy}: testbed {command}: "
                             f"{done.stderr.strip().splitlines()[-1]}")
        results: dict[str, Any] = json.loads(Path(f"{tmp}/run/results.json").read_text())
    return results


def run_row(row: str, iterations: int) -> dict[str, Any]:
    """The row emulated (root), then simulated."""
    name, policy = row.split(":")
    topology = load_inputs(topology_file(name)).topology
    results = testbed_results("up", name, policy, iterations)
    connections = [{**c, "model_window_segments": round(
        model_window_segments(topology, c["host"], c["peer"]), 1)}
        for c in results["wan_connections"]]
    emulation = results.get("emulation") or {}
    return {"topology": name, "policy": policy, "iterations": iterations,
            "emulated_s": results["iteration_time_s"]["median"],
            "machine_bound": bool(emulation.get("cpu_bound")),
            "connections": connections, **simulate_row(name, policy, iterations)}


def simulate_row(name: str, policy: str, iterations: int) -> dict[str, Any]:
    """The row under `testbed simulate`: its iteration time, and its WAN pairs at the end."""
    results = testbed_results("simulate", name, policy, iterations)
    return {"simulated_s": results["iteration_time_s"]["median"],
            "model_connections": results.get("wan_connections") or []}


def resimulated(report: dict[str, Any],
                simulate: Callable[[str, str, int], dict[str, Any]] = simulate_row
                ) -> dict[str, Any]:
    """The report with each run's simulated side run again (`simulate`), its emulated side
    as it was, and the commit each side is from."""
    runs = [{**run, **simulate(run["topology"], run["policy"], run["iterations"])}
            for run in report["runs"]]
    emulated = report.get("emulated_commit", report.get("commit"))
    return {**report, "runs": runs, "commit": commit(), "emulated_commit": emulated}


def _span(values: list[float]) -> str:
    if not values:
        return "-"
    low, high = min(values), max(values)
    return f"{low:,.0f}" if low == high else f"{low:,.0f}-{high:,.0f}"


def below(connection: dict[str, Any]) -> bool:
    """Whether its slow starts now stop short of what the simulator's keep in flight before
    any loss."""
    threshold = connection["ssthresh_segments"]
    return threshold is not None and threshold < connection["model_window_segments"]


def model_thresholds(run: dict[str, Any]) -> str:
    """Where the model's slow starts stop at the run's end, and on how many connections."""
    conns = run.get("model_connections") or []
    stopping = [c for c in conns if c["ssthresh_segments"] is not None]
    if not stopping:
        return "-" if not conns else "none"
    count = sum(c.get("connections", 1) for c in stopping)
    total = sum(c.get("connections", 1) for c in conns)
    return f"{_span([c['ssthresh_segments'] for c in stopping])} on {count} of {total}"


def table(report: dict[str, Any]) -> str:
    lines = ["| topology | policy | emulated | simulated | WAN connections | sent segments "
             "again | segments sent again | slow start ends at (segments) | the model's "
             "slow start ends at | its buffers' window (segments) | stopping short of it | "
             "machine-bound |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in report["runs"]:
        conns = run["connections"]
        lost = [c["retransmitted_segments"] for c in conns if c["retransmitted_segments"]]
        thresholds = [c["ssthresh_segments"] for c in conns
                      if c["ssthresh_segments"] is not None]
        simulated = f"{run['simulated_s']:.2f} s" if run["simulated_s"] else "-"
        lines.append(
            f"| {run['topology']} | {run['policy']} | {run['emulated_s']:.2f} s | "
            f"{simulated} | {len(conns)} | {len(lost)} | {_span(lost)} | "
            f"{_span(thresholds)} | {model_thresholds(run)} | "
            f"{_span([c['model_window_segments'] for c in conns])} | "
            f"{sum(below(c) for c in conns)} of {len(conns)} | "
            f"{'yes' if run['machine_bound'] else 'no'} |")
    return "\n".join(lines)


def summary(report: dict[str, Any]) -> str:
    runs = report["runs"]
    conns = [c for run in runs for c in run["connections"]]
    short = [c for c in conns if below(c)]
    ratios = [c["ssthresh_segments"] / c["model_window_segments"] for c in short]
    text = (f"Of {len(conns)} WAN connections in {len(runs)} runs, {len(short)} ended with "
            "their slow start stopping short of the window the simulator's connections "
            "reach before any loss")
    if len(ratios) == 1:
        text += f" (at {ratios[0]:.0%} of it)"
    elif ratios:
        text += (f" (at {min(ratios):.0%}-{max(ratios):.0%} of it, median "
                 f"{statistics.median(ratios):.0%})")
    lost = sum(1 for c in conns if c["retransmitted_segments"])
    text += f"; {lost} had sent segments again."
    model = [c for run in runs for c in run.get("model_connections") or []]
    if model:
        cut = sum(c.get("connections", 1) for c in model if c["ssthresh_segments"] is not None)
        text += (f" In the model, {cut} of {sum(c.get('connections', 1) for c in model)} "
                 "connections ended with a slow-start threshold.")
    emulated = report.get("emulated_commit")
    if emulated and emulated != report.get("commit"):
        text += (f" The emulated runs are from commit {emulated}, the simulated ones from the "
                 "commit below.")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", default=",".join(ROWS),
                        help="TOPOLOGY:POLICY, comma-separated")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "wan-tcp.json")
    parser.add_argument("--resimulate", action="store_true",
                        help="run the simulated side of --json's rows again, keeping its "
                        "emulated runs")
    args = parser.parse_args()
    if args.resimulate:
        if not args.json.exists():
            raise SystemExit(f"bench_wan_tcp: --resimulate: {args.json} does not exist")
        report = resimulated(json.loads(args.json.read_text()))
    else:
        runs = []
        for row in args.rows.split(","):
            runs.append(run_row(row, args.iterations))
            print(json.dumps({k: v for k, v in runs[-1].items()
                              if k not in ("connections", "model_connections")}), flush=True)
        report = {"commit": commit(), "runs": runs}
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    print()
    print(summary(report))


if __name__ == "__main__":
    main()
