#!/usr/bin/env python3
"""Worker transport goodput with 1, 2, 4, 8, 16 TCP connections on a 1 Gbit/s link at
20, 50 and 100 ms RTT, against the link rate and the one-flow window limit.

Run as root: `.venv/bin/python scripts/bench_transport.py [--megabytes 128] [--json F]`.
Each point sends `--messages` messages of `--megabytes` back to back (the first one includes
TCP slow start) and reports the median goodput.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from testbed.net.network import bring_up, tear_down
from testbed.topology import parse_topology


def goodputs(network: Any, connections: int, megabytes: int, messages: int) -> list[float]:
    src, dst = network.layout.node("east-0"), network.layout.node("west-0")
    server = subprocess.Popen(
        ["ip", "netns", "exec", dst.netns, sys.executable, "-m", "testbed.runtime.probe",
         "serve", dst.address, "--connections", str(connections), "--messages", str(messages)])
    try:
        time.sleep(0.2)
        sent = subprocess.run(
            ["ip", "netns", "exec", src.netns, sys.executable, "-m", "testbed.runtime.probe",
             "send", dst.address, "--connections", str(connections), "--messages",
             str(messages), "--bytes", str(megabytes * 2**20)],
            capture_output=True, text=True, timeout=600, check=True)
    finally:
        server.wait(timeout=60)
    rows = [json.loads(line) for line in sent.stdout.splitlines()]
    return [r["bytes"] * 8 / r["seconds"] for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--megabytes", type=int, default=128)
    parser.add_argument("--messages", type=int, default=3)
    parser.add_argument("--rtts", default="20,50,100", help="RTTs in ms")
    parser.add_argument("--connections", default="1,2,4,8,16")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for rtt in [float(x) for x in args.rtts.split(",")]:
        topology = parse_topology({
            "tcp": {"congestion": "cubic"},
            "datacenters": [{"name": "east", "gpus": 1}, {"name": "west", "gpus": 1}],
            "wan": [{"between": ["east", "west"], "latency": f"{rtt / 2}ms",
                     "bandwidth": "1Gbit"}]}, "bench")
        network = bring_up(topology)
        try:
            for n in [int(x) for x in args.connections.split(",")]:
                values = goodputs(network, n, args.megabytes, args.messages)
                rows.append({"rtt_ms": rtt, "connections": n,
                             "median_gbps": statistics.median(values) / 1e9,
                             "first_gbps": values[0] / 1e9, "of_link": statistics.median(values)
                             / 1e9, "window_limit_gbps": min(1.0, n * 4 * 2**20 * 8 /
                                                             (rtt / 1e3) / 1e9)})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            tear_down(network)
    print("\n| RTT | connections | goodput (median) | first message | of 1 Gbit/s | "
          "n x window/RTT (capped) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['rtt_ms']:g} ms | {r['connections']} | {r['median_gbps']:.3f} Gbit/s | "
              f"{r['first_gbps']:.3f} Gbit/s | {r['of_link']:.0%} | "
              f"{r['window_limit_gbps']:.2f} Gbit/s |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
