#!/usr/bin/env python3
"""Worker transport goodput with 1, 2, 4, 8, 16 TCP connections on a 1 Gbit/s link at
20, 50 and 100 ms RTT, against the link rate and the one-flow window limit; with
`--pacing`, paced against unpaced striping and iperf3 -P N on one link.

Run as root: `.venv/bin/python scripts/bench_transport.py [--megabytes 128] [--json F]`.
Each point sends `--messages` messages of `--megabytes` back to back (the first one includes
TCP slow start) and reports the median goodput.

`--pacing [--latency 20ms] [--repeat 3]`: one 21 MB message (a paper-3dc microbatch's
activations) over 1, 3, 4 and 6 connections on a 1 Gbit/s link, with slow start after idle
off and on: iperf3 -P N on fresh connections (the reference that is not ours), the worker
transport on fresh connections, and on warm ones (the median of five messages sent 1 s
apart), unpaced and paced (testbed.plan.pacing). Seconds until the receiver has every byte.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from testbed.emulator.net.network import bring_up, tear_down
from testbed.emulator.runtime.coordinator.probe import timed_messages
from testbed.topology import parse_topology


def goodputs(network: Any, connections: int, megabytes: int, messages: int) -> list[float]:
    size = megabytes * 2**20
    return [size * 8 / t for t in timed_messages(network, "east-0", "west-0", connections,
                                                 messages, size, timeout_s=600)]


PACING_BYTES = 21 * 2**20


def _probe_seconds(network: Any, connections: int, messages: int, pace_bps: float) -> list[float]:
    return timed_messages(network, "east-0", "west-0", connections, messages, PACING_BYTES,
                          pace_bps, gap_s=1.0)


def _iperf_seconds(network: Any, connections: int) -> float:
    src, dst = network.layout.node("east-0"), network.layout.node("west-0")
    server = subprocess.Popen(["ip", "netns", "exec", dst.netns, "iperf3", "-s", "-1", "-B",
                               dst.address], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        out = subprocess.run(["ip", "netns", "exec", src.netns, "iperf3", "-c", dst.address,
                              "-P", str(connections), "-n", str(PACING_BYTES), "-J"],
                             capture_output=True, text=True, timeout=120, check=True)
    finally:
        server.wait(timeout=60)
    return float(json.loads(out.stdout)["end"]["sum_received"]["seconds"])


def pacing_rows(latency: str, repeat: int) -> list[dict[str, Any]]:
    from testbed.plan.pacing import PACING_SHARE

    rows = []
    for idle_restart in (False, True):
        topology = parse_topology({
            "tcp": {"congestion": "cubic", "slow_start_after_idle": idle_restart},
            "datacenters": [{"name": "east", "gpus": 1}, {"name": "west", "gpus": 1}],
            "wan": [{"between": ["east", "west"], "latency": latency, "bandwidth": "1Gbit"}]},
            "bench")
        network = bring_up(topology)
        try:
            for n in (1, 3, 4, 6):
                iperf = [_iperf_seconds(network, n) for _ in range(repeat)]
                unpaced = _probe_seconds(network, n, 6, 0.0)
                paced = _probe_seconds(network, n, 6, 1e9)
                rows.append({"slow_start_after_idle": idle_restart, "connections": n,
                             "iperf3_fresh_s": statistics.median(iperf),
                             "fresh_unpaced_s": unpaced[0], "fresh_paced_s": paced[0],
                             "warm_unpaced_s": statistics.median(unpaced[1:]),
                             "warm_unpaced_range_s": [min(unpaced[1:]), max(unpaced[1:])],
                             "warm_paced_s": statistics.median(paced[1:]),
                             "warm_paced_range_s": [min(paced[1:]), max(paced[1:])],
                             "pacing_share": PACING_SHARE})
                print(json.dumps(rows[-1]), flush=True)
        finally:
            tear_down(network)
    print("\n| slow start after idle | connections | iperf3 -P N, fresh | ours fresh, unpaced | "
          "ours fresh, paced | ours warm, unpaced | ours warm, paced |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {'on' if r['slow_start_after_idle'] else 'off'} | {r['connections']} | "
              f"{r['iperf3_fresh_s']:.3f} s | {r['fresh_unpaced_s']:.3f} s | "
              f"{r['fresh_paced_s']:.3f} s | {r['warm_unpaced_s']:.3f} s "
              f"({r['warm_unpaced_range_s'][0]:.2f}-{r['warm_unpaced_range_s'][1]:.2f}) | "
              f"{r['warm_paced_s']:.3f} s "
              f"({r['warm_paced_range_s'][0]:.2f}-{r['warm_paced_range_s'][1]:.2f}) |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--megabytes", type=int, default=128)
    parser.add_argument("--messages", type=int, default=3)
    parser.add_argument("--rtts", default="20,50,100", help="RTTs in ms")
    parser.add_argument("--connections", default="1,2,4,8,16")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--pacing", action="store_true",
                        help="paced vs unpaced striping against iperf3 (see above)")
    parser.add_argument("--latency", default="20ms", help="one way, for --pacing")
    parser.add_argument("--repeat", type=int, default=3, help="iperf3 runs per point")
    args = parser.parse_args()
    if args.pacing:
        rows = pacing_rows(args.latency, args.repeat)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return
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
