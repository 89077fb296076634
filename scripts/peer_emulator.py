"""The emulator's side of scripts/bench_peers.py (root): real Linux TCP in the emulated
WAN. Shares from iperf3 (one flow per source DC, all started together, over the
congestion control's SHARE_WINDOWS), bursts with the worker transport (rounds of one message from
each source, all started together on one clock), transfers with the worker transport on
fresh connections, paced where the plan paces; every run with the machine's signals
(cores busy, the delay lines' lateness) and whether they say it set the pace."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

from peer_cases import (
    BurstCase,
    ShareCase,
    TransferCase,
    burst_topology,
    share_topology,
    transfer_topology,
)

from testbed.emulator.net.network import Network, bring_up, tear_down
from testbed.emulator.runtime.coordinator.health import (
    assess,
    busy_share,
    delay_line_lateness,
    read_cpu,
)
from testbed.emulator.runtime.coordinator.probe import PORT as PROBE_PORT
from testbed.emulator.runtime.coordinator.probe import timed_messages
from testbed.plan.pacing import PACING_SHARE, paced
from testbed.topology import Topology

SHARE_WINDOWS: dict[str, tuple[float, float]] = {
    "cubic": (60.0, 10.0), "bbr": (60.0, 10.0), "reno": (15.0, 5.0)}
"""(seconds measured, seconds left out before them) of a share run, per congestion
control: a share is steady only over several of the slowest flow's congestion epochs.
CUBIC's epoch is K = cbrt(W_max (1 - beta) / C) (RFC 8312, beta 0.7, C 0.4): 8.7 s for a
100 ms flow at 100 Mbit/s, 6.9 s for a 200 ms one at 25; BBR probes its minimum RTT
every 10 s. 60 s after 10 covers five or more of either. Reno regrows a halved window by
one segment per round trip, about 40 s at 100 ms and 100 Mbit/s, so steady shares
would take minutes a run; its runs stay at the shorter window they were recorded over
(a share over it is short of one epoch of its longest flows)."""


def _pace(topology: Topology, size: int) -> float:
    """The pair's rate in bit/s where the plan paces a message of `size` east to west,
    as the workers pace it; 0: unpaced."""
    return (topology.bottleneck_bps("east", "west") * PACING_SHARE
            if paced(topology, "east", "west", size) else 0.0)


def _machine(network: Network, before: Any) -> dict[str, Any]:
    lateness = delay_line_lateness(network.delay_line_stats())
    health = assess(busy_share(before, read_cpu()), [], lateness)
    return {"cpu_busy": round(health.cpu_busy, 3),
            "delay_line_late_mean_ms": None if lateness is None else lateness[0] * 1e3,
            "machine_bound": health.cpu_bound, "reasons": list(health.reasons)}


def _shares_once(network: Network, case: ShareCase) -> list[float]:
    """Each flow's receiver-side goodput in bit/s over the same seconds."""
    dst = network.layout.node("dst-0")
    pace = network.topology.bottleneck_bps("s0", "dst") * PACING_SHARE
    seconds, omit = SHARE_WINDOWS[case.congestion]
    servers = [subprocess.Popen(["ip", "netns", "exec", dst.netns, "iperf3", "-s", "-1", "-p",
                                 str(5301 + i)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for i in range(len(case.rtts_ms))]
    clients: list[subprocess.Popen[str]] = []
    try:
        time.sleep(0.3)
        for i in range(len(case.rtts_ms)):
            src = network.layout.node(f"s{i}-0")
            args = ["iperf3", "-c", dst.address, "-p", str(5301 + i), "-t", f"{seconds:g}",
                    "-O", f"{omit:g}", "-J", "-C", case.congestion]
            if case.paced:
                args += ["--fq-rate", str(int(pace))]
            clients.append(subprocess.Popen(["ip", "netns", "exec", src.netns, *args],
                                            stdout=subprocess.PIPE, text=True))
        rates = []
        for client in clients:
            out, _ = client.communicate(timeout=seconds + omit + 60)
            report = json.loads(out)
            if "error" in report:
                raise RuntimeError(f"iperf3: {report['error']}")
            rates.append(float(report["end"]["sum_received"]["bits_per_second"]))
        return rates
    finally:  # clients too: one left running when the network goes spins on its socket
        for process in [*clients, *servers]:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait(timeout=5)


def shares(case: ShareCase, repeat: int) -> dict[str, Any]:
    network = bring_up(share_topology(case))
    runs = []
    try:
        for _ in range(repeat):
            before = read_cpu()
            rates = _shares_once(network, case)
            runs.append({"mbps": [r / 1e6 for r in rates], **_machine(network, before)})
            print(json.dumps({"case": case.name, **runs[-1]}), flush=True)
    finally:
        tear_down(network)
    seconds, omit = SHARE_WINDOWS[case.congestion]
    return {**case.recorded(), "seconds": seconds, "omit_s": omit, "runs": runs}


BURST_START_S = 5.0
"""How long after launch the senders' first message starts: every pair's serve and send
processes have started, imported and connected by then."""


def bursts(case: BurstCase, rounds: int) -> dict[str, Any]:
    """The case's rounds of one message from every sender, all on one schedule (the
    senders share the machine's clock), with the worker transport over connections kept
    open between rounds, paced as the plan paces: per round, each message's seconds from
    its first byte sent to the receiver having it whole."""
    topology = burst_topology(case)
    size = int(case.megabytes * 1e6)
    pace = _pace(topology, size)
    network = bring_up(topology)
    try:
        before = read_cpu()
        at = time.monotonic() + BURST_START_S
        with concurrent.futures.ThreadPoolExecutor(case.flows) as pool:
            seconds = list(pool.map(lambda i: timed_messages(
                network, f"east-{i}", f"west-{i}", 1, rounds, size, pace,
                timeout_s=BURST_START_S + rounds * case.every_s + 120, at=at,
                every_s=case.every_s), range(case.flows)))
        machine = _machine(network, before)
    finally:
        tear_down(network)
    by_round = [list(r) for r in zip(*seconds, strict=True)]
    print(json.dumps({"case": case.name, "rounds": by_round, **machine}), flush=True)
    return {"case": case.name, "flows": case.flows, "rtt_ms": case.rtt_ms, "rate": case.rate,
            "congestion": case.congestion, "megabytes": case.megabytes,
            "every_s": case.every_s, "paced": pace > 0, "rounds": by_round, **machine}


def transfer(case: TransferCase, repeat: int, per_connection: bool = False, seed: int = 0
             ) -> dict[str, Any]:
    """The case's message over fresh connections, paced where the plan paces: seconds
    from its first byte sent to the receiver having it whole. `seed`: the delay lines'
    for their random loss (the runs of one call draw on in turn; a call with the same
    seed draws the same losses again). `per_connection` (the
    `stripes` part): each connection's TCP state is also sampled every 10 ms (`ss -tin`
    in the sender's namespace), and each run lists per connection the bytes it carried of
    the message, the slow-start threshold its first loss set (in segments; None where it
    never left slow start) and its retransmissions."""
    topology = transfer_topology(case)
    size = int(case.megabytes * 1e6)
    pace = _pace(topology, size)
    network = bring_up(topology, seed=seed)
    runs = []
    try:
        for _ in range(repeat):
            before = read_cpu()
            with _watched(network.layout.node("east-0").netns) if per_connection \
                    else contextlib.nullcontext() as connections:
                (seconds,) = timed_messages(network, "east-0", "west-0", case.connections, 1,
                                            size, pace, timeout_s=900)
            run: dict[str, Any] = {"seconds": seconds, "seed": seed,
                                   **_machine(network, before)}
            if connections is not None:
                run["connections"] = connections
            runs.append(run)
            print(json.dumps({"case": case.name, **run}), flush=True)
    finally:
        tear_down(network)
    return {"case": case.name, "rtt_ms": case.rtt_ms, "congestion": case.congestion,
            "loss": case.loss, "connections": case.connections, "megabytes": case.megabytes,
            "paced": pace > 0, "runs": runs}


def _ss_fields(line: str) -> dict[str, float]:
    """The numbers of `ss -tin`'s line that say what limits a sender."""
    out: dict[str, float] = {}
    for key in ("cwnd", "ssthresh", "unacked", "notsent", "snd_wnd", "bytes_acked"):
        match = re.search(rf"\b{key}:(\d+)", line)
        if match:
            out[key] = float(match.group(1))
    match = re.search(r"\bretrans:\d+/(\d+)", line)
    if match:
        out["retrans"] = float(match.group(1))
    for key in ("rwnd_limited", "sndbuf_limited", "busy"):
        match = re.search(rf"\b{key}:(\d+)ms", line)
        if match:
            out[f"{key}_ms"] = float(match.group(1))
    return out


def _per_connection(out: str) -> dict[str, dict[str, float]]:
    """`ss -tin`'s numbers for each of the sender's connections, by its local port (each
    connection is a line of addresses, then an indented line of its numbers)."""
    connections: dict[str, dict[str, float]] = {}
    port = None
    for line in out.splitlines():
        address = re.search(rf":(\d+)\s+\S+:{PROBE_PORT}\b", line)
        if address:
            port = address.group(1)
        elif port is not None and "cwnd" in line:
            connections[port] = _ss_fields(line)
    return connections


def _ss(netns: str) -> str:
    """`ss -tin` of the sender's connections to the probe, in its namespace."""
    return subprocess.run(["ip", "netns", "exec", netns, "ss", "-tinH", "state", "established",
                           "dport", str(PROBE_PORT)], capture_output=True, text=True,
                          check=False).stdout


@contextlib.contextmanager
def _watched(netns: str) -> Iterator[list[dict[str, float | None]]]:
    """Every 10 ms while inside, each connection's numbers; on the way out, the list it
    yields is filled, per connection: the bytes it carried, the slow-start threshold it
    had when one was first seen (its first loss set it; None if never) and its
    retransmissions."""
    last: dict[str, dict[str, float]] = {}
    first_threshold: dict[str, float] = {}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for port, fields in _per_connection(_ss(netns)).items():
                last[port] = fields
                if "ssthresh" in fields:
                    first_threshold.setdefault(port, fields["ssthresh"])
            time.sleep(0.01)

    thread = threading.Thread(target=watch)
    thread.start()
    connections: list[dict[str, float | None]] = []
    try:
        yield connections
    finally:
        stop.set()
        thread.join()
        connections.extend({"bytes_acked": fields.get("bytes_acked", 0.0),
                            "first_ssthresh": first_threshold.get(port),
                            "retransmits": fields.get("retrans", 0.0)}
                           for port, fields in sorted(last.items()))


def in_flight(case: TransferCase) -> dict[str, Any]:
    """One transfer of the case with the sender's TCP state sampled every 50 ms (`ss
    -tin` in its namespace): what it keeps in flight once its window stopped growing,
    and what limited it (the kernel's own counters of time limited by the receiver's
    window and by the send buffer)."""
    topology = transfer_topology(case)
    size = int(case.megabytes * 1e6)
    pace = _pace(topology, size)
    network = bring_up(topology)
    samples: list[tuple[float, dict[str, float]]] = []
    stop = threading.Event()
    before = read_cpu()

    def sample() -> None:
        netns = network.layout.node("east-0").netns
        started = time.monotonic()
        while not stop.is_set():
            fields = _ss_fields(_ss(netns).replace("\n", " "))
            if "cwnd" in fields:
                samples.append((time.monotonic() - started, fields))
            time.sleep(0.05)

    thread = threading.Thread(target=sample)
    thread.start()
    try:
        (seconds,) = timed_messages(network, "east-0", "west-0", case.connections, 1, size,
                                    pace, timeout_s=900)
        machine = _machine(network, before)
    finally:
        stop.set()
        thread.join()
        tear_down(network)
    # steady: the samples after the congestion window stopped growing
    peak = max(s["cwnd"] for _, s in samples)
    steady = [(t, s) for t, s in samples if s["cwnd"] >= 0.95 * peak and "bytes_acked" in s]
    (t0, first), (t1, last) = steady[0], steady[-1]
    goodput = (last["bytes_acked"] - first["bytes_acked"]) * 8 / (t1 - t0)
    final = samples[-1][1]
    return {"case": case.name, "rate": case.rate, "rtt_ms": case.rtt_ms, "seconds": seconds,
            "steady_goodput_mbps": goodput / 1e6, **machine,
            "unacked_segments": [s.get("unacked", 0.0) for _, s in steady],
            "notsent_bytes": [s.get("notsent", 0.0) for _, s in steady],
            "snd_wnd_bytes": [s.get("snd_wnd", 0.0) for _, s in steady],
            "cwnd_segments": peak, "rwnd_limited_ms": final.get("rwnd_limited_ms"),
            "sndbuf_limited_ms": final.get("sndbuf_limited_ms"),
            "busy_ms": final.get("busy_ms"), "samples": len(samples)}
