#!/usr/bin/env python3
"""Where real TCP's slow starts stop in an emulated run. Rows of the fidelity table, each run
once under `testbed up`, each WAN connection's TCP state as its kernel left it when training
ended (results.json's `wan_connections`: window, slow-start threshold, segments sent again)
beside what the simulator's connection keeps in flight (its buffers' window,
testbed.plan.tcp_model.in_flight_bytes), which every slow start of the simulator's reaches:
a real connection's threshold below it caps each of its later slow starts after an idle.

Run as root: `.venv/bin/python scripts/bench_wan_tcp.py [--rows paper-3dc:1f1b,...]
[--iterations 4] [--json benchmarks/wan-tcp.json]`. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
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


def run_row(row: str, iterations: int) -> dict[str, Any]:
    name, policy = row.split(":")
    path = topology_file(name)
    topology = load_inputs(path).topology
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run(
            [str(Path(sys.executable).parent / "testbed"), "up", str(path), "-p", policy,
             "--iterations", str(iterations), "--out", f"{tmp}/run"],
            capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise SystemExit(f"bench_wan_tcp: {row}: {done.stderr.strip().splitlines()[-1]}")
        results = json.loads(Path(f"{tmp}/run/results.json").read_text())
    connections = [{**c, "model_window_segments": round(
        model_window_segments(topology, c["host"], c["peer"]), 1)}
        for c in results["wan_connections"]]
    emulation = results.get("emulation") or {}
    return {"topology": name, "policy": policy, "iterations": iterations,
            "emulated_s": results["iteration_time_s"]["median"],
            "simulated_s": results.get("predicted_iteration_s"),
            "machine_bound": bool(emulation.get("cpu_bound")),
            "connections": connections}


def _span(values: list[float]) -> str:
    if not values:
        return "-"
    low, high = min(values), max(values)
    return f"{low:,.0f}" if low == high else f"{low:,.0f}-{high:,.0f}"


def below(connection: dict[str, Any]) -> bool:
    """Whether its slow starts now stop short of what the simulator's keep in flight."""
    threshold = connection["ssthresh_segments"]
    return threshold is not None and threshold < connection["model_window_segments"]


def table(report: dict[str, Any]) -> str:
    lines = ["| topology | policy | emulated | simulated | WAN connections | sent segments "
             "again | segments sent again | slow start ends at (segments) | the model's "
             "window (segments) | stopping short of it | machine-bound |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in report["runs"]:
        conns = run["connections"]
        lost = [c["retransmitted_segments"] for c in conns if c["retransmitted_segments"]]
        thresholds = [c["ssthresh_segments"] for c in conns
                      if c["ssthresh_segments"] is not None]
        simulated = f"{run['simulated_s']:.2f} s" if run["simulated_s"] else "-"
        lines.append(
            f"| {run['topology']} | {run['policy']} | {run['emulated_s']:.2f} s | "
            f"{simulated} | {len(conns)} | {len(lost)} | {_span(lost)} | "
            f"{_span(thresholds)} | {_span([c['model_window_segments'] for c in conns])} | "
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
            "reach")
    if len(ratios) == 1:
        text += f" (at {ratios[0]:.0%} of it)"
    elif ratios:
        text += (f" (at {min(ratios):.0%}-{max(ratios):.0%} of it, median "
                 f"{statistics.median(ratios):.0%})")
    lost = sum(1 for c in conns if c["retransmitted_segments"])
    return text + f"; {lost} had sent segments again."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rows", default=",".join(ROWS),
                        help="TOPOLOGY:POLICY, comma-separated")
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "wan-tcp.json")
    args = parser.parse_args()
    runs = []
    for row in args.rows.split(","):
        runs.append(run_row(row, args.iterations))
        print(json.dumps({k: v for k, v in runs[-1].items() if k != "connections"}),
              flush=True)
    report = {"commit": commit(), "runs": runs}
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    print()
    print(summary(report))


if __name__ == "__main__":
    main()
