#!/usr/bin/env python3
"""One emulated WAN across machines against the same WAN on one machine (needs root).

`.venv/bin/python scripts/bench_cluster.py [TOPOLOGY] [--split east+central,west]
[--json F]`: the machines are namespaces on a bridge (testbed.emulator.net.namespace_cluster),
each bringing up its share as `testbed net up --cluster F --machine M` does. For every WAN
link it measures ping RTT (median of 30) and iperf3 throughput (4 flows, 3 s) between the
first hosts of its two DCs (4 and 8 flows), on one machine and across the cluster, and the time each
machine took to bring its share up. Default: paper-3dc, each DC on its own machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed.emulator.net.check import iperf_bps, ping_rtts
from testbed.emulator.net.namespace_cluster import namespace_machines
from testbed.emulator.net.network import Network, bring_up, tear_down
from testbed.topology import load_topology
from testbed.topology.cluster import load_cluster
from testbed.topology.model import Topology

ROOT = Path(__file__).resolve().parent.parent


def measure(networks: list[Network], topology: Topology) -> dict[str, dict[str, float]]:
    """RTT and rate of every WAN link between the first hosts of its DCs."""
    def node(dc: str) -> tuple[str, str]:
        for network in networks:
            for n in network.layout.nodes:
                if n.dc == dc:
                    return n.netns, n.address
        raise KeyError(dc)

    out = {}
    for link in topology.links:
        (src, _), (dst, address) = node(link.a), node(link.b)
        rtts = ping_rtts(src, address, count=30, interval_s=0.01)
        out[f"{link.a}-{link.b}"] = {"rtt_ms": statistics.median(rtts) * 1e3,
                                     "configured_rtt_ms": 2e3 * link.latency_s,
                                     "rate_bps": iperf_bps(src, dst, address, 4, 3),
                                     "rate_8_bps": iperf_bps(src, dst, address, 8, 3),
                                     "configured_bps": link.bandwidth_bps}
        print(json.dumps({link.a + "-" + link.b: out[f"{link.a}-{link.b}"]}), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("topology", nargs="?", default=str(ROOT / "topologies" / "paper-3dc.yaml"))
    parser.add_argument("--split", help="machines' DCs: DC+DC,DC,... (default: one DC each)")
    parser.add_argument("--mtu", type=int, default=1500,
                        help="the cluster network's MTU (the emulated interfaces get 50 less)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    topology = load_topology(args.topology)
    groups = ([g.split("+") for g in args.split.split(",")] if args.split
              else [[dc.name] for dc in topology.datacenters])
    results: dict[str, Any] = {"topology": topology.name, "split": groups, "mtu": args.mtu}
    started = time.monotonic()
    single = bring_up(topology)
    results["one_machine"] = {"setup_s": time.monotonic() - started}
    try:
        results["one_machine"]["links"] = measure([single], topology)
    finally:
        tear_down(single)
    names = [f"m{i + 1}" for i in range(len(groups))]
    with namespace_machines(names, mtu=args.mtu) as machines, \
            tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "cluster.yaml"
        path.write_text(json.dumps({"mtu": args.mtu, "machines": [
            {"name": m.name, "address": m.address, "netns": m.netns, "dcs": dcs}
            for m, dcs in zip(machines, groups, strict=True)]}))
        cluster = load_cluster(path, topology)
        shares: list[Network] = []
        setup = {}
        try:
            for machine in machines:
                began = time.monotonic()
                shares.append(bring_up(topology, cluster=cluster, machine=machine.name))
                setup[machine.name] = time.monotonic() - began
            results["cluster"] = {"setup_s": setup, "links": measure(shares, topology)}
        finally:
            for share in shares:
                tear_down(share)
    print("\n| link | RTT configured | one machine | across machines | rate configured | "
          "4 flows: one machine | across machines | 8 flows: one machine | across machines |"
          "\n|---|---|---|---|---|---|---|---|---|")
    for name, one in results["one_machine"]["links"].items():
        many = results["cluster"]["links"][name]
        print(f"| {name} | {one['configured_rtt_ms']:.1f} ms | {one['rtt_ms']:.2f} ms | "
              f"{many['rtt_ms']:.2f} ms | {one['configured_bps'] / 1e9:.2f} Gbit/s | "
              f"{one['rate_bps'] / 1e9:.3f} | {many['rate_bps'] / 1e9:.3f} | "
              f"{one['rate_8_bps'] / 1e9:.3f} | {many['rate_8_bps'] / 1e9:.3f} |")
    print(f"\nsetup: one machine {results['one_machine']['setup_s']:.1f} s; per machine "
          + ", ".join(f"{k} {v:.1f} s" for k, v in setup.items()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
