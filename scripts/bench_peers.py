#!/usr/bin/env python3
"""The simulator's flow-level TCP against real Linux TCP (the emulator) and against two
established simulators where they are installed: ns-3 (packet level, the `ns3` package
from PyPI) and SimGrid (flow level, Debian's python3-simgrid, run by /usr/bin/python3).

Cases (scripts/peer_cases.py): shares of one 200 Mbit/s bottleneck among flows of different
RTTs (2 flows of 20 and 100 ms, 8 of 10-200 ms; unpaced and paced as the plan paces; CUBIC,
BBR and Reno), and the two flows again at 50 and 400 Mbit/s and behind a deep queue and one
half as deep (`held-out`: the RTT bias is fitted on the 200 Mbit/s runs alone, behind a
shallow queue, so these check it out of sample); bursts, rounds of 2, 4 and 8 messages of 21
MB started together from as many hosts over one 1 Gbit/s, 40 ms link (a pipeline's replicas
sending their activations at once); transfers on a 1 Gbit/s, 50 ms link with 0.01%, 0.1% and
1% loss over 1, 4 and 16 fresh connections (and those over several connections at 0.1% and
1% again, each connection's share and first loss sampled: `stripes`; at 0.03% and 0.3% over
1 and 4, rates the loss model was not built on: `between`); one long flow (200 MB, one
connection, Linux's default buffers, 50 and 100 ms); and the CPU time of N concurrent flows
over shared links (windows open), against SimGrid's in the same run. The emulator's
forwarding ceiling (200 MB over 16 connections, negligible loss: its delay lines forward a
lossy link's every packet) caps a second simulated link for each lossy case, which says how
much of that case's error is the machine's. The RTT bias's exponents are fitted to the share
runs (scripts/rtt_bias_fit.py) and recorded beside those the simulator uses; one
connection's window at 1, 2, 4 and 10 Gbit/s (`windows`: 200 MB at 40 ms, what it delivers
per round trip) is fitted the same way (scripts/window_fit.py).

Emulator measurements need root and a quiet machine (run under the project's lock):
`.venv/bin/python scripts/bench_peers.py --emulator shares,long,loss,ceiling --emulator-json F`
records them (each run with the machine's signals); then
`.venv/bin/python scripts/bench_peers.py --from-emulator F [--scale 1000,10000,100000]
--json benchmarks/peers.json` compares every backend with them (no root needed).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from peer_cases import (
    CEILING,
    EIGHT_RTTS_MS,
    BurstCase,
    ShareCase,
    TransferCase,
    between_cases,
    burst_cases,
    burst_topology,
    held_out_share_cases,
    long_cases,
    loss_cases,
    scale_job,
    share_cases,
    share_topology,
    stripe_cases,
    transfer_topology,
    window_cases,
)
from rtt_bias_fit import fit_rtt_bias, measured
from window_fit import rows as window_rows

from testbed.plan.pacing import PACING_SHARE, paced
from testbed.plan.tcp_model import MSS, RTT_BIAS, WINDOW_EFFICIENCY
from testbed.sim.agenda import Agenda
from testbed.sim.loss_cycles import first_losses
from testbed.sim.network import FluidNetwork, Pair
from testbed.sim.one_transfer import burst_rounds_s, one_transfer, one_transfer_s, shared_rates
from testbed.topology import Topology

ROOT = Path(__file__).resolve().parent.parent
SIMGRID_PYTHON = "/usr/bin/python3"

def chosen_cases(parts: list[str], congestions: tuple[str, ...], names: set[str] | None
                 ) -> dict[str, list[Any]]:
    """Each part's cases to record: every one, or those `names` names (an error names any
    that is none of the parts' cases)."""
    cases: dict[str, list[Any]] = {
        "shares": share_cases(congestions), "held-out": held_out_share_cases(congestions),
        "bursts": burst_cases(congestions), "long": long_cases(congestions),
        "loss": loss_cases(congestions), "between": between_cases(congestions),
        "stripes": stripe_cases(congestions), "ceiling": [CEILING],
        "inflight": long_cases(("cubic",)), "windows": window_cases()}
    unknown = sorted(set(parts) - cases.keys())
    if unknown:
        raise SystemExit(f"bench_peers.py: --emulator: no part {', '.join(unknown)} "
                         f"(parts: {', '.join(cases)})")
    out = {part: [c for c in cases[part] if names is None or c.name in names]
           for part in parts}
    missing = sorted((names or set()) - {c.name for found in out.values() for c in found})
    if missing:
        raise SystemExit(f"bench_peers.py: --cases: {', '.join(missing)} is not a case of "
                         f"{', '.join(parts)} for {', '.join(congestions)}")
    return out


def emulator(parts: list[str], congestions: tuple[str, ...], repeat: int, seed: int = 0,
             names: set[str] | None = None) -> dict[str, Any]:
    """`seed`: the delay lines' for random loss (the lossy parts: loss, between, stripes,
    ceiling); `names`: the cases to record (all of the parts' where None)."""
    import peer_emulator

    cases = chosen_cases(parts, congestions, names)
    out: dict[str, Any] = {}
    if "shares" in parts:
        out["shares"] = [peer_emulator.shares(c, repeat) for c in cases["shares"]]
    if "held-out" in parts:
        out["held_out_shares"] = [peer_emulator.shares(c, repeat) for c in cases["held-out"]]
    if "bursts" in parts:
        out["bursts"] = [peer_emulator.bursts(c, 2 * repeat) for c in cases["bursts"]]
    if "long" in parts:
        out["long"] = [peer_emulator.transfer(c, repeat) for c in cases["long"]]
    if "loss" in parts:
        out["loss"] = [peer_emulator.transfer(c, max(1, repeat - 1), seed=seed)
                       for c in cases["loss"]]
    if "between" in parts:
        out["between"] = [peer_emulator.transfer(c, repeat, seed=seed)
                          for c in cases["between"]]
    if "stripes" in parts:
        out["stripes"] = [peer_emulator.transfer(c, repeat, per_connection=True, seed=seed)
                          for c in cases["stripes"]]
    if "ceiling" in parts:
        out["ceiling"] = [peer_emulator.transfer(c, repeat, seed=seed) for c in cases["ceiling"]]
    if "inflight" in parts:
        out["inflight"] = [peer_emulator.in_flight(c) for c in cases["inflight"]
                           for _ in range(repeat)]
    if "windows" in parts:
        out["windows"] = [peer_emulator.in_flight(c) for c in cases["windows"]
                          for _ in range(repeat)]
    return out


def simgrid_version() -> str | None:
    if not Path(SIMGRID_PYTHON).exists():
        return None
    done = subprocess.run([SIMGRID_PYTHON, "-c", "import simgrid; print(simgrid.simgrid_version)"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() or None if done.returncode == 0 else None


def simgrid(links: dict[str, tuple[float, float]], flows: list[tuple[str, str, float, float,
                                                                      list[str]]]
            ) -> dict[str, Any]:
    done = subprocess.run([SIMGRID_PYTHON, str(ROOT / "scripts" / "peer_simgrid.py")],
                          input=json.dumps({"links": links, "flows": flows}),
                          capture_output=True, text=True, check=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _route(topology: Topology, src: str, dst: str) -> list[tuple[str, float, float]]:
    """(name, bit/s, one-way s) of each WAN link on the route."""
    hops = topology.path(src, dst)
    return [(f"{a}>{b}", topology.link(a, b).bandwidth_bps, topology.link(a, b).latency_s)
            for a, b in itertools.pairwise(hops)]


def simgrid_shares(case: ShareCase) -> list[float]:
    """SimGrid gives finish times, not rates: flow i's share is read from two runs where
    it moves 1 and 2 GB while the others move far more (it ends first, all running):
    the difference of its bytes over the difference of its times (latencies cancel)."""
    topology = share_topology(case)
    links: dict[str, tuple[float, float]] = {}
    routes = []
    for i in range(len(case.rtts_ms)):
        route = _route(topology, f"s{i}", "dst")
        links.update({name: (bps, latency) for name, bps, latency in route})
        routes.append([name for name, _, _ in route])
    rates = []
    for i in range(len(routes)):
        ends = []
        for size in (1e9, 2e9):
            flows = [(f"s{k}", "dst", size if k == i else 1e13, 0.0, routes[k])
                     for k in range(len(routes))]
            ends.append(simgrid(links, flows)["finished"][i])
        rates.append(1e9 * 8 / (ends[1] - ends[0]))
    return rates


def simgrid_transfer(case: TransferCase) -> float:
    topology = transfer_topology(case)
    route = _route(topology, "east", "west")
    links = {name: (bps, latency) for name, bps, latency in route}
    per = case.megabytes * 1e6 / case.connections
    flows = [("east", "west", per, 0.0, [name for name, _, _ in route])
             for _ in range(case.connections)]
    return float(max(simgrid(links, flows)["finished"]))


def ns3_shares(case: ShareCase, from_s: float, to_s: float) -> list[float]:
    import peer_ns3

    topology = share_topology(case)
    neck = topology.link("hub", "dst")
    access = [topology.link(f"s{i}", "hub").latency_s for i in range(len(case.rtts_ms))]
    pace = neck.bandwidth_bps * PACING_SHARE if case.paced else 0.0
    tcp = topology.tcp
    return peer_ns3.run(access, [1] * len(access), [0.0] * len(access), neck.bandwidth_bps,
                        neck.latency_s, neck.effective_queue_bytes, 0.0, case.congestion,
                        tcp.wmem[2], tcp.rmem[2], pace, from_s, to_s)


def ns3_transfer(case: TransferCase) -> float:
    import peer_ns3

    topology = transfer_topology(case)
    link = topology.link("east", "west")
    size = case.megabytes * 1e6
    pace = link.bandwidth_bps * PACING_SHARE if paced(topology, "east", "west", size) else 0.0
    tcp = topology.tcp
    (seconds,) = peer_ns3.run([1e-6], [case.connections], [size], link.bandwidth_bps,
                              link.latency_s, link.effective_queue_bytes, case.loss,
                              case.congestion, tcp.wmem[2], tcp.rmem[2], pace)
    return seconds


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


KEPT: dict[str, Any] = {}
"""Rows of an earlier run by case (or flow count), for --peers-from."""


def compare_shares(recorded: list[dict[str, Any]], peers: dict[str, Any], ns3_window: float
                   ) -> list[dict[str, Any]]:
    rows = []
    for entry in recorded:
        case = ShareCase.from_recorded(entry)
        topology = share_topology(case)
        start = entry["omit_s"]  # the emulator's window: iperf3 leaves out its first seconds
        sim = shared_rates(topology, [f"s{i}" for i in range(len(case.rtts_ms))], "dst",
                           start, start + entry["seconds"], case.paced)
        runs = [run["mbps"] for run in entry["runs"]]
        flows = []
        for i, rtt in enumerate(case.rtts_ms):
            emulated = _spread([run[i] for run in runs])
            flows.append({"rtt_ms": rtt, "emulator_mbps": emulated, "sim_mbps": sim[i] / 1e6,
                          "error": sim[i] / 1e6 / emulated["median"] - 1,
                          "inside_spread": emulated["min"] <= sim[i] / 1e6 <= emulated["max"]})
        row: dict[str, Any] = {"case": case.name, "congestion": case.congestion,
                               "paced": case.paced, "rate": case.rate, "queue": case.queue,
                               "seconds": entry["seconds"],
                               "omit_s": entry["omit_s"], "flows": flows,
                               "machine_bound_runs": sum(r["machine_bound"] for r in
                                                         entry["runs"]),
                               "runs": len(runs)}
        kept = KEPT.get(case.name)
        if kept is not None:
            for flow, old in zip(flows, kept["flows"], strict=True):
                flow |= {k: v for k, v in old.items() if k in ("ns3_mbps", "simgrid_mbps")}
            row |= {k: v for k, v in kept.items() if k.startswith("ns3_")}
        elif peers.get("ns3") and (len(case.rtts_ms) == 2 or not case.paced):
            started = time.perf_counter()
            rates = ns3_shares(case, 2.0, 2.0 + ns3_window)
            row["ns3_seconds_measured"] = ns3_window
            row["ns3_wall_s"] = time.perf_counter() - started
            for flow, rate in zip(flows, rates, strict=True):
                flow["ns3_mbps"] = rate / 1e6
        if peers.get("simgrid") and kept is None:
            for flow, rate in zip(flows, simgrid_shares(case), strict=True):
                flow["simgrid_mbps"] = rate / 1e6
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def rtt_bias_fits(recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per congestion control and pacing, the RTT bias the simulator uses and the fit of
    the recorded share runs (scripts/rtt_bias_fit.py): of all of them, as the constants
    are fitted, and of the two-flow and the eight-flow cases alone."""
    cases = measured(recorded)
    fits = {n: fit_rtt_bias([c for c in cases if n is None or len(c.case.rtts_ms) == n])
            for n in (None, 2, len(EIGHT_RTTS_MS))}
    return [{"congestion": congestion, "paced": paced, "used": RTT_BIAS.get((congestion, paced)),
             "fitted": fitted, "fitted_two_flows": fits[2].get((congestion, paced)),
             "fitted_eight_flows": fits[len(EIGHT_RTTS_MS)].get((congestion, paced))}
            for (congestion, paced), fitted in fits[None].items()]


def _goodputs_mbps(case: dict[str, Any]) -> list[float]:
    """Each recorded run's goodput of a transfer case, Mbit/s."""
    return [case["megabytes"] * 8 / run["seconds"] for run in case["runs"]]


def ceiling_mbps(recorded: list[dict[str, Any]]) -> float | None:
    """The median goodput of the recorded ceiling runs (Mbit/s): the fastest this machine's
    delay lines forward a lossy link's packets; None where none was recorded."""
    goodputs = [g for case in recorded for g in _goodputs_mbps(case)]
    return statistics.median(goodputs) if goodputs else None


def _sim_transfer_s(case: TransferCase) -> float:
    return one_transfer_s(transfer_topology(case), "east", "west", int(case.megabytes * 1e6),
                          case.connections, False)


def compare_transfers(recorded: list[dict[str, Any]], peers: dict[str, Any],
                      ceiling: float | None = None) -> list[dict[str, Any]]:
    """Each case's emulated seconds against the simulator's; where the link loses packets
    and a `ceiling` (Mbit/s) was measured, also against the simulator on the same link
    capped at it: the emulator forwards a lossy link's every packet through its delay
    lines (no offloads), and a case near that limit measures the machine, not TCP."""
    rows = []
    for entry in recorded:
        case = TransferCase(entry["case"], entry["rtt_ms"], "1Gbit", entry["congestion"],
                            entry["loss"], entry["connections"], entry["megabytes"])
        sim = _sim_transfer_s(case)
        seconds = [run["seconds"] for run in entry["runs"]]
        emulated = _spread(seconds)
        row: dict[str, Any] = {
            "case": case.name, "congestion": case.congestion, "loss": case.loss,
            "connections": case.connections, "megabytes": case.megabytes,
            "rtt_ms": case.rtt_ms, "emulator_s": emulated, "sim_s": sim,
            "error": sim / emulated["median"] - 1,
            "inside_spread": emulated["min"] <= sim <= emulated["max"],
            "machine_bound_runs": sum(r["machine_bound"] for r in entry["runs"]),
            "delay_line_late_mean_ms": max(r["delay_line_late_mean_ms"] or 0.0
                                           for r in entry["runs"]),
            "runs": len(seconds)}
        if ceiling is not None and case.loss > 0:
            capped = _sim_transfer_s(dataclasses.replace(case, rate=f"{ceiling * 1e6:.0f}bit"))
            row |= {"ceiling_mbps": ceiling, "sim_at_ceiling_s": capped,
                    "error_at_ceiling": capped / emulated["median"] - 1}
        kept = KEPT.get(case.name)
        if kept is not None:
            row |= {k: v for k, v in kept.items() if k in ("ns3_s", "simgrid_s")}
        else:
            if peers.get("ns3"):
                row["ns3_s"] = ns3_transfer(case)
            if peers.get("simgrid"):
                row["simgrid_s"] = simgrid_transfer(case)
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def model_stripes(case: TransferCase) -> dict[str, Any]:
    """The simulator's own run of the case, connection by connection (Pair.cycles): the
    least and the most of an even share of the message one carried, and the threshold
    the earliest first loss set (segments; None where none came) and what its connection
    carried."""
    seconds, pair = one_transfer(transfer_topology(case), "east", "west",
                                 int(case.megabytes * 1e6), case.connections, False)
    even = case.megabytes * 1e6 / case.connections
    shares = [cycle.carried / even for cycle in pair.cycles]
    lost = [cycle for cycle in pair.cycles if cycle.ssthresh != float("inf")]
    earliest = min(lost, key=lambda cycle: cycle.ssthresh, default=None)
    return {"sim_s": seconds, "model_least_share": min(shares, default=None),
            "model_most_share": max(shares, default=None),
            "model_first_threshold": None if earliest is None else earliest.ssthresh / MSS,
            "model_earliest_share": None if earliest is None else earliest.carried / even,
            "model_first_loss_after": first_losses(case.connections)[0] / case.loss}


def compare_stripes(recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each striped run's connections: the least and the most of an even share of the
    message a connection carried (the transport deals its chunks to the connections with
    room), how many left slow start (and of those, how many without a retransmission: not
    a loss, CUBIC's HyStart, ended it), the smallest threshold a first loss set and what
    that connection carried, beside the same figures of the simulator's run."""
    rows = []
    for entry in recorded:
        case = TransferCase(entry["case"], entry["rtt_ms"], "1Gbit", entry["congestion"],
                            entry["loss"], entry["connections"], entry["megabytes"])
        model = model_stripes(case)
        even = case.megabytes * 1e6 / case.connections
        for run in entry["runs"]:
            carried = [c["bytes_acked"] for c in run["connections"]]
            left = [c for c in run["connections"] if c["first_ssthresh"] is not None]
            earliest = min(left, key=lambda c: c["first_ssthresh"], default=None)
            unlost = [c["first_ssthresh"] for c in left if not c["retransmits"]]
            row = {"case": case.name, "congestion": case.congestion, "loss": case.loss,
                   "connections": case.connections, "megabytes": case.megabytes,
                   "emulator_s": run["seconds"],
                   "sampled": len(carried), "least_share": min(carried) / even,
                   "most_share": max(carried) / even, "left_slow_start": len(left),
                   "earliest_threshold": None if earliest is None
                   else earliest["first_ssthresh"],
                   "earliest_share": None if earliest is None
                   else earliest["bytes_acked"] / even,
                   "left_without_loss": len(unlost),
                   "thresholds_without_loss": [min(unlost), max(unlost)] if unlost else None,
                   **model, "machine_bound": run["machine_bound"]}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def compare_bursts(recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each burst case's rounds: the emulator's first round and its later ones (each
    round's mean over its messages; the later ones' median round) against the
    simulator's on the same schedule, and how far apart a round's messages finished in
    the emulator (the simulator's finish together: equal flows get equal shares)."""
    rows = []
    for entry in recorded:
        case = BurstCase(entry["case"], entry["flows"], entry["rtt_ms"], entry["rate"],
                         entry["congestion"], entry["megabytes"])
        rounds = entry["rounds"]
        sim = burst_rounds_s(burst_topology(case), "east", "west", case.flows,
                             int(case.megabytes * 1e6), entry["every_s"], len(rounds))
        emulated = [statistics.fmean(r) for r in rounds]
        simulated = [statistics.fmean(r) for r in sim]
        later_emulated = statistics.median(emulated[1:])
        later_sim = statistics.median(simulated[1:])
        row = {"case": case.name, "congestion": case.congestion, "flows": case.flows,
               "paced": entry["paced"], "megabytes": case.megabytes, "rtt_ms": case.rtt_ms,
               "rounds": len(rounds), "emulator_first_s": emulated[0],
               "sim_first_s": simulated[0], "error_first": simulated[0] / emulated[0] - 1,
               "emulator_later_s": later_emulated, "sim_later_s": later_sim,
               "error_later": later_sim / later_emulated - 1,
               "emulator_apart": statistics.fmean((max(r) - min(r)) / statistics.fmean(r)
                                                  for r in rounds),
               "sim_apart": statistics.fmean((max(r) - min(r)) / statistics.fmean(r)
                                             for r in sim),
               "machine_bound": entry["machine_bound"]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def fluid_cpu_s(flows: int) -> tuple[float, float]:
    """CPU seconds of the simulator's flow model moving `flows` concurrent flows, and
    when the last one ends."""
    job = scale_job(flows)
    agenda = Agenda()
    network = FluidNetwork(dict(job.capacity), agenda.at)
    ends = [0.0]
    window = WINDOW_EFFICIENCY * 4 * 2**20
    started = time.process_time()
    for flow in job.flows:
        pair = Pair(1, window, flow.rtt, False)
        pair.cwnd, pair.last_active = window, 0.0  # open windows: sharing alone

        def go(t: float, flow: Any = flow, pair: Pair = pair) -> None:
            network.start(t, flow.nbytes, flow.route, pair, 0.0,
                          lambda end: ends.append(end))
        agenda.at(flow.start, go)
    agenda.run()
    return time.process_time() - started, max(ends)


def scale(sizes: list[int], peers: dict[str, Any], fluid_limit: int, simgrid_limit: int
          ) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        row: dict[str, Any] = {"flows": n, "mss": MSS}
        if peers.get("simgrid") and n > simgrid_limit:
            row["simgrid_cpu_s"] = None
            row["simgrid_not_run"] = (f"past --simgrid-limit {simgrid_limit}: its CPU time "
                                      "grows faster than linearly in the flows")
        elif peers.get("simgrid"):  # always measured again: the CPU times compare in one run
            job = scale_job(n)
            links = {k: (job.capacity[k], job.latency[k]) for k in job.capacity}
            flows = [(f.src, f.dst, f.nbytes, f.start, list(f.route)) for f in job.flows]
            result = simgrid(links, flows)
            row["simgrid_cpu_s"] = result["cpu_s"]
            row["simgrid_last_s"] = max(result["finished"])
        if n <= fluid_limit:
            cpu, last = fluid_cpu_s(n)
            row["sim_cpu_s"], row["sim_last_s"] = cpu, last
        else:
            row["sim_cpu_s"] = None
        if row.get("simgrid_cpu_s") and row.get("sim_cpu_s"):
            row["ratio"] = row["sim_cpu_s"] / row["simgrid_cpu_s"]
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def measured_with(earlier: dict[str, Any]) -> dict[str, Any] | None:
    """The peers found by the run that measured the ns-3 and SimGrid figures an earlier
    output holds: its own, or, where it kept them from another, that run's (an older
    output names it at the end of a chain of `kept_from`)."""
    kept: dict[str, Any] | None = earlier.get("peers_kept_from")
    if kept is None:
        found: dict[str, Any] | None = earlier.get("peers")
        return found
    while "measured_with" not in kept and kept.get("kept_from"):
        kept = kept["kept_from"]
    found = kept.get("measured_with", kept.get("peers"))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--emulator", default="",
                        help="parts to record: shares,held-out,bursts,long,loss,between,"
                             "stripes,ceiling,inflight,windows")
    parser.add_argument("--emulator-json", type=Path, help="where to record them")
    parser.add_argument("--cases", help="record only these cases of the parts "
                                        "(comma-separated names, as the JSON names them)")
    parser.add_argument("--from-emulator", type=Path, action="append", default=[],
                        help="recorded emulator runs to compare with (repeatable)")
    parser.add_argument("--congestion", default="cubic,bbr")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0,
                        help="the emulator's delay lines' seed for random loss: a recording "
                             "to pool with an earlier one needs another, or it draws the "
                             "same losses again")
    parser.add_argument("--scale", default="1000,2000,5000,10000")
    parser.add_argument("--fluid-limit", type=int, default=100000,
                        help="most flows the simulator's own run is measured at")
    parser.add_argument("--simgrid-limit", type=int, default=10000,
                        help="most flows SimGrid's run is measured at")
    parser.add_argument("--ns3-window", type=float, default=6.0,
                        help="seconds of ns-3's share measurements (after 2 s)")
    parser.add_argument("--no-ns3", action="store_true")
    parser.add_argument("--peers-from", type=Path,
                        help="an earlier output whose ns-3 and SimGrid figures of the cases "
                             "to keep (theirs do not change with this project's code); the "
                             "CPU times are always measured again, in the same run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    congestions = tuple(args.congestion.split(","))
    if args.emulator:
        from testbed.emulator.net.interrupts import stop_signals

        with stop_signals():  # SIGTERM too tears down the network and its iperf3s
            data = emulator(args.emulator.split(","), congestions, args.repeat, args.seed,
                            set(args.cases.split(",")) if args.cases else None)
        if args.emulator_json:
            args.emulator_json.write_text(json.dumps(data, indent=1))
        return
    import peer_ns3

    earlier: dict[str, Any] = {}
    if args.peers_from:
        earlier = json.loads(args.peers_from.read_text())
        KEPT.update({row["case"]: row for part in ("shares", "long", "loss", "between")
                     for row in earlier.get(part, [])})
    peers = {"ns3": None if args.no_ns3 else peer_ns3.available(),
             "simgrid": simgrid_version()}
    print(f"peers found: ns-3 {peers['ns3'] or 'not installed'}, SimGrid "
          f"{peers['simgrid'] or 'not installed'}", flush=True)
    recorded: dict[str, list[dict[str, Any]]] = {}
    for path in args.from_emulator:
        for part, entries in json.loads(path.read_text()).items():
            recorded.setdefault(part, []).extend(entries)
    ceiling = ceiling_mbps(recorded.get("ceiling", []))
    out: dict[str, Any] = {
        "peers": peers, "eight_rtts_ms": list(EIGHT_RTTS_MS),
        "machine": {"cpus": os.cpu_count(), "load": os.getloadavg(),
                    "python": platform.python_version()},
        "shares": compare_shares(recorded.get("shares", []), peers, args.ns3_window),
        "rtt_bias": rtt_bias_fits(recorded.get("shares", [])),
        "held_out_shares": compare_shares(recorded.get("held_out_shares", []), peers,
                                          args.ns3_window),
        "bursts": compare_bursts(recorded.get("bursts", [])),
        "long": compare_transfers(recorded.get("long", []), peers, ceiling),
        "loss": compare_transfers(recorded.get("loss", []), peers, ceiling),
        "between": compare_transfers(recorded.get("between", []), peers, ceiling),
        "stripes": compare_stripes(recorded.get("stripes", [])),
        "inflight": recorded.get("inflight", []),
        "windows": window_rows(recorded.get("windows", [])),
        "ceiling": [{"case": c["case"], "connections": c["connections"],
                     "megabytes": c["megabytes"], "loss": c["loss"],
                     "goodput_mbps": _goodputs_mbps(c),
                     "delay_line_late_mean_ms": [r["delay_line_late_mean_ms"]
                                                 for r in c["runs"]]}
                    for c in recorded.get("ceiling", [])],
        "scale": scale([int(x) for x in args.scale.split(",") if x], peers, args.fluid_limit,
                       args.simgrid_limit),
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    out["machine"]["load_at_end"] = os.getloadavg()
    if earlier:  # whose figures of the cases --peers-from kept, and who measured them
        out["peers_kept_from"] = {"file": args.peers_from.name, "peers": earlier.get("peers"),
                                  "measured_with": measured_with(earlier)}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
