#!/usr/bin/env python3
"""Fidelity and cost of the emulated WAN, measured: RTT against the configured latency,
throughput against the configured rate, the single-flow window limit, bring-up and
teardown times, and the userspace shaper's CPU cost per Gbit/s.

Run as root: `.venv/bin/python scripts/bench_net.py [--quick] [--json out.json]`.
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from testbed.emulator.net.check import iperf_bps, ping_rtts
from testbed.emulator.net.netns import list_namespaces
from testbed.emulator.net.network import bring_up, tear_down
from testbed.topology import load_topology, parse_topology

ROOT = Path(__file__).resolve().parent.parent


def pair(latency: str, rate: str = "1Gbit", gpus: int = 1) -> Any:
    return parse_topology(
        {
            "tcp": {"congestion": "cubic"},
            "datacenters": [{"name": "east", "gpus": gpus}, {"name": "west", "gpus": gpus}],
            "wan": [{"between": ["east", "west"], "latency": latency, "bandwidth": rate}],
        },
        "bench",
    )


def rtt_table(latencies_ms: list[float], count: int) -> list[dict[str, float]]:
    rows = []
    for one_way in latencies_ms:
        network = bring_up(pair(f"{one_way}ms"))
        try:
            rtts = ping_rtts(
                network.netns_of("east-0"),
                network.address_of("west-0"),
                count=count,
                interval_s=0.01,
            )
        finally:
            tear_down(network)
        configured = 2 * one_way / 1e3
        rows.append(
            {
                "one_way_ms": one_way,
                "rtt_configured_ms": configured * 1e3,
                "median_ms": statistics.median(rtts) * 1e3,
                "min_ms": min(rtts) * 1e3,
                "p99_ms": sorted(rtts)[int(0.99 * (len(rtts) - 1))] * 1e3,
                "tolerance_ms": (0.001 + 0.02 * configured) * 1e3,
            }
        )
    return rows


def throughput_table(
    rates: list[str], latency: str, flows: int, seconds: float
) -> list[dict[str, Any]]:
    rows = []
    for rate in rates:
        network = bring_up(pair(latency, rate))
        try:
            src, dst = network.layout.node("east-0"), network.layout.node("west-0")
            one = iperf_bps(src.netns, dst.netns, dst.address, 1, seconds)
            before = _cpu(network)
            started = time.monotonic()
            many = iperf_bps(src.netns, dst.netns, dst.address, flows, seconds)
            elapsed = time.monotonic() - started
            cpu = _cpu(network) - before
        finally:
            tear_down(network)
        configured = network.topology.links[0].bandwidth_bps
        gbit_moved = many * seconds / 1e9
        rows.append(
            {
                "rate": rate,
                "rtt_ms": 2 * network.topology.links[0].latency_s * 1e3,
                "one_flow_gbps": one / 1e9,
                f"{flows}_flows_gbps": many / 1e9,
                "of_rate": many / configured,
                "window_limit_gbps": 4
                * 1024**2
                * 8
                / (2 * network.topology.links[0].latency_s)
                / 1e9,
                "delay_line_cores_per_gbps": cpu / gbit_moved if gbit_moved else None,
                "measure_s": elapsed,
            }
        )
    return rows


def _cpu(network: Any) -> float:
    return sum(s.get("cpu_s", 0.0) for s in network.delay_line_stats().values())


def scale_table(cycles: int) -> list[dict[str, Any]]:
    rows = []
    for name, topology in (
        ("paper-3dc (12 hosts)", load_topology(ROOT / "topologies" / "paper-3dc.yaml")),
        (
            "64 hosts, 4 DCs",
            parse_topology(
                {
                    "datacenters": [{"name": f"dc{i}", "gpus": 16} for i in range(4)],
                    "wan": [
                        {"between": [f"dc{i}", f"dc{j}"], "latency": "10ms", "bandwidth": "1Gbit"}
                        for i in range(4)
                        for j in range(i + 1, 4)
                    ],
                },
                "64",
            ),
        ),
    ):
        ups, downs = [], []
        before = set(list_namespaces())
        leftovers = 0
        for _ in range(cycles):
            started = time.monotonic()
            network = bring_up(topology)
            ups.append(time.monotonic() - started)
            started = time.monotonic()
            tear_down(network)
            downs.append(time.monotonic() - started)
            leftovers += len(set(list_namespaces()) - before)
        rows.append(
            {
                "topology": name,
                "cycles": cycles,
                "up_s": statistics.median(ups),
                "down_s": statistics.median(downs),
                "leftover_namespaces": leftovers,
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        cells = [f"{v:.3f}" if isinstance(v, float) else str(v) for v in row.values()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="fewer points, shorter runs")
    parser.add_argument("--json", type=Path, help="also write all numbers here")
    args = parser.parse_args()
    quick = args.quick
    results = {
        "rtt": rtt_table(
            [1, 5, 20, 50, 100, 150] if not quick else [1, 50, 150], 100 if not quick else 30
        ),
        "throughput_100ms_rtt": throughput_table(
            ["100Mbit", "500Mbit", "1Gbit", "2Gbit"] if not quick else ["1Gbit"],
            "50ms",
            8,
            8.0 if not quick else 4.0,
        ),
        "scale": scale_table(5 if not quick else 2),
    }
    for name, rows in results.items():
        print(f"\n## {name}\n")
        print(markdown(rows))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
