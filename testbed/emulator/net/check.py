"""Measuring the emulated WAN with real tools: ping for RTT, iperf3 for throughput."""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

from testbed.emulator.net.network import Network
from testbed.emulator.net.shaping import Shaper
from testbed.errors import NetworkError
from testbed.topology.model import Topology

IPERF_PORT = 5201


def _exec(netns: str, args: list[str]) -> list[str]:
    return ["ip", "netns", "exec", netns, *args]


def ping_rtts(
    netns: str,
    address: str,
    count: int = 50,
    interval_s: float = 0.01,
    timeout_s: float = 60.0,
    reply_wait_s: float = 5.0,
) -> list[float]:
    """Round-trip times in seconds, from our microsecond-resolution pinger in `netns`; it
    waits `reply_wait_s` after the last request for the replies still out (on a lossy
    link, some never come)."""
    result = subprocess.run(
        _exec(
            netns,
            [
                sys.executable,
                "-m",
                "testbed.emulator.net.pinger",
                address,
                "--count",
                str(count),
                "--interval",
                f"{interval_s:g}",
                "--timeout",
                f"{reply_wait_s:g}",
            ],
        ),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    try:
        rtts = [float(r) for r in json.loads(result.stdout)["rtts"]]
    except (ValueError, KeyError):
        rtts = []
    if not rtts:
        raise NetworkError(
            f"ping from {netns} to {address} got no replies: "
            f"{(result.stderr or result.stdout).strip()[-200:]}"
        )
    return rtts


def iperf_bps(
    client_ns: str,
    server_ns: str,
    server_address: str,
    streams: int = 1,
    seconds: float = 5.0,
    omit_s: float = 1.0,
    port: int = IPERF_PORT,
    congestion: str | None = None,
) -> float:
    """Receiver-side goodput in bit/s of an iperf3 run with `streams` parallel flows."""
    server = subprocess.Popen(
        _exec(server_ns, ["iperf3", "-s", "-1", "-p", str(port)]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        time.sleep(0.2)
        args = [
            "iperf3",
            "-c",
            server_address,
            "-p",
            str(port),
            "-P",
            str(streams),
            "-t",
            f"{seconds:g}",
            "-O",
            f"{omit_s:g}",
            "-J",
        ]
        if congestion:
            args += ["-C", congestion]
        result = subprocess.run(
            _exec(client_ns, args),
            capture_output=True,
            text=True,
            timeout=seconds + omit_s + 30,
            check=False,
        )
        try:
            report = json.loads(result.stdout)
        except ValueError:
            raise NetworkError(f"iperf3 from {client_ns} failed: {result.stderr.strip()}") from None
        if "error" in report:
            raise NetworkError(f"iperf3 from {client_ns}: {report['error']}")
        return float(report["end"]["sum_received"]["bits_per_second"])
    finally:
        with contextlib.suppress(ProcessLookupError):
            server.kill()
        server.wait(timeout=5)


def expected_rtt(topology: Topology, src_dc: str, dst_dc: str, shaper: Shaper) -> float:
    """Configured host-to-host RTT: the WAN path both ways, plus intra-DC latency where the
    shaper adds it (netem puts half of it on each host link)."""
    rtt = 2 * topology.one_way_latency(src_dc, dst_dc)
    if shaper is Shaper.NETEM:
        rtt += topology.dc(src_dc).latency_s + topology.dc(dst_dc).latency_s
    return rtt


def window_limit_bps(window_bytes: int, rtt_s: float) -> float:
    return window_bytes * 8 / rtt_s


@dataclass(frozen=True)
class LinkCheck:
    a: str
    b: str
    rtt_configured_s: float
    rtt_min_s: float
    rtt_median_s: float
    rate_configured_bps: float
    one_flow_bps: float
    many_flows_bps: float
    flows: int
    window_limit_bps: float

    def as_dict(self) -> dict[str, float | str | int]:
        return dict(self.__dict__)


def check_link(
    network: Network, a: str, b: str, seconds: float = 5.0, flows: int = 8, pings: int = 50
) -> LinkCheck:
    """RTT, one-flow and many-flow throughput between the first hosts of DCs `a` and `b`."""
    topology = network.topology
    src = network.layout.node(f"{a}-0")
    dst = network.layout.node(f"{b}-0")
    rtts = ping_rtts(src.netns, dst.address, count=pings)
    one = iperf_bps(src.netns, dst.netns, dst.address, 1, seconds)
    many = iperf_bps(src.netns, dst.netns, dst.address, flows, seconds)
    configured = expected_rtt(topology, a, b, network.shaper)
    window = min(topology.tcp_for(a).wmem[2], topology.tcp_for(b).rmem[2])
    return LinkCheck(
        a,
        b,
        configured,
        min(rtts),
        statistics.median(rtts),
        topology.bottleneck_bps(a, b),
        one,
        many,
        flows,
        window_limit_bps(window, configured),
    )
