"""The network as plain data: layout and shaping, checked without root (Mininet style)."""

from __future__ import annotations

import ipaddress
import math
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.emulator.net.cleanup import DownReport
from testbed.emulator.net.delayline import Port
from testbed.emulator.net.layout import MIN_QUEUE_BYTES, Shape, build_layout, check_limits
from testbed.emulator.net.shaping import TBF_MAX_BPS, Shaper, htb_burst, netem_limit, plan_shaping
from testbed.errors import InputError, NetworkError
from testbed.topology import parse_topology

from .strategies import topologies


@given(topologies(), st.integers(0, 63))
def test_layout_names_and_addresses_are_unique_and_valid(topology: Any, slot: int) -> None:
    layout = build_layout(topology, slot)
    namespaces = layout.namespaces()
    assert len(namespaces) == len(set(namespaces))
    addresses = [n.address for n in layout.nodes] + [p.address for p in layout.ports]
    assert len(addresses) == len(set(addresses))
    for address in addresses:
        assert ipaddress.ip_address(address).is_private
    for port in layout.ports:
        assert len(port.ifname) <= 15 and len(port.tun) <= 15
        assert layout.port(port.peer, port.dc).peer_address == port.address
    assert [n.name for n in layout.nodes] == [g.name for g in topology.gpus()]
    if slot == 0:
        assert all(n.netns == n.name for n in layout.nodes)
    else:
        assert all(n.netns == f"tb{slot}-{n.name}" for n in layout.nodes)
    for dc, table in layout.routes.items():
        assert set(table) == {d.name for d in topology.datacenters} - {dc}
        for hop in table.values():
            assert topology.has_link(dc, hop)


@given(topologies())
def test_two_slots_never_share_names_or_addresses(topology: Any) -> None:
    a, b = build_layout(topology, 0), build_layout(topology, 1)
    assert not set(a.namespaces()) & set(b.namespaces())
    assert not {n.address for n in a.nodes} & {n.address for n in b.nodes}


@given(topologies(min_dcs=2))
def test_userspace_shaping_puts_a_delay_line_on_every_wan_direction(topology: Any) -> None:
    layout = build_layout(topology)
    if any(link.bandwidth_bps > TBF_MAX_BPS for link in topology.links):
        with pytest.raises(NetworkError, match="above what tbf can shape"):
            plan_shaping(layout, Shaper.USERSPACE)
        return
    plan = plan_shaping(layout, Shaper.USERSPACE)
    assert len(plan.delay_lines) == 2 * len(topology.links)
    for spec in plan.delay_lines:
        port = layout.port(spec.dc, spec.tun.removeprefix("d-"))
        link = topology.link(port.dc, port.peer)
        assert spec.delay_s == link.latency_s
        assert spec.jitter_s == link.jitter_s and spec.loss == link.loss
        tbf = [q for q in plan.qdiscs if q.ifname == port.tun and q.netns == spec.netns]
        assert [q.kind for q in tbf] == ["tbf"]
        assert tbf[0].params["rate"] == int(link.bandwidth_bps / 8)
        assert tbf[0].params["limit"] >= link.effective_queue_bytes
    assert not any(q.kind == "netem" for q in plan.qdiscs)


@given(topologies(min_dcs=2))
def test_netem_shaping_puts_rate_then_netem_on_every_wan_direction(topology: Any) -> None:
    layout = build_layout(topology)
    plan = plan_shaping(layout, Shaper.NETEM)
    assert not plan.delay_lines
    for port in layout.ports:
        ns = layout.router(port.dc).netns
        kinds = [q.kind for q in plan.qdiscs if q.netns == ns and q.ifname == port.ifname]
        assert kinds == ["htb", "htb-class", "netem"]
        netem = next(
            q
            for q in plan.qdiscs
            if q.netns == ns and q.ifname == port.ifname and q.kind == "netem"
        )
        link = topology.link(port.dc, port.peer)
        assert netem.params["delay"] == pytest.approx(link.latency_s * 1e6)
        bdp_packets = link.bandwidth_bps * link.latency_s / 8 / 1500
        assert netem.params["limit"] >= bdp_packets


@given(
    st.sampled_from([1e6, 1e8, 1e9, 1e10]),
    st.sampled_from([0.001, 0.02, 0.15]),
    st.sampled_from([65536, 10**6, 10**7]),
)
def test_netem_limit_covers_the_bandwidth_delay_product(
    rate: float, delay: float, queue: int
) -> None:
    shape = Shape(rate, delay, queue_bytes=queue)
    assert netem_limit(shape) * 1500 >= rate * delay / 8 + queue
    assert netem_limit(shape) >= 1000
    assert htb_burst(rate) >= 2 * 65536


def test_host_links_carry_half_the_dc_latency_each_way() -> None:
    topology = parse_topology(
        {
            "datacenters": [{"name": "a", "gpus": 1, "latency": "2ms"}, {"name": "b", "gpus": 1}],
            "wan": [{"between": ["a", "b"], "latency": "5ms", "bandwidth": "1Gbit"}],
        },
        "t",
    )
    layout = build_layout(topology)
    node = layout.node("a-0")
    assert node.uplink.delay_s == pytest.approx(0.001)
    assert node.uplink.queue_bytes >= MIN_QUEUE_BYTES
    plan = plan_shaping(layout, Shaper.USERSPACE)
    assert any("intra-DC latency of a" in note for note in plan.notes)


@pytest.mark.parametrize("shaper", [Shaper.NETEM, Shaper.USERSPACE])
def test_rates_reach_tc_as_whole_bytes_per_second(shaper: Shaper) -> None:
    """A WAN written in bytes per second (1.25GB/s = 10 Gbit/s) is shaped at that rate;
    every rate goes to the kernel as an integer of bytes per second (tc's ratespec unit),
    never as tc's text units, where `mbps` means megabytes."""
    topology = parse_topology(
        {
            "datacenters": [{"name": "a", "gpus": 1, "bandwidth": "100Gbps"},
                            {"name": "b", "gpus": 1, "bandwidth": "100Gbit"}],
            "wan": [{"between": ["a", "b"], "latency": "5ms", "bandwidth": "250MB/s"}],
        },
        "t",
    )
    assert topology.link("a", "b").bandwidth_bps == 2e9
    layout = build_layout(topology)
    plan = plan_shaping(layout, shaper)
    rates = [(q.kind, q.params[k]) for q in plan.qdiscs for k in ("rate", "ceil")
             if k in q.params]
    assert rates and all(type(rate) is int for _, rate in rates)
    wan = {q.params["rate"] for q in plan.qdiscs
           if any(q.ifname in (p.ifname, p.tun) for p in layout.ports) and "rate" in q.params}
    assert wan == {250_000_000}
    assert {rate for _, rate in rates} == {250_000_000, 12_500_000_000}


def test_down_counts_what_it_removed_in_words_that_agree() -> None:
    """`testbed down` said "removed 1 runs"."""
    one = DownReport(runs=["r1"], namespaces=["a"], processes=[7])
    assert one.summary() == ["removed 1 run, 1 namespace, 1 stray process"]
    two = DownReport(runs=["r1", "r2"], namespaces=["a", "b"], processes=[7, 8], stopped=["r1"])
    assert two.summary() == ["stopped 1 live run (each removed what it had made)",
                             "removed 2 runs, 2 namespaces, 2 stray processes"]
    assert DownReport(live=["r3"]).summary() == ["nothing to remove (1 live run left alone)"]
    assert DownReport().summary() == ["nothing to remove"]


def test_limits_are_checked_before_anything_is_made() -> None:
    topology = parse_topology({"datacenters": [{"name": "a", "gpus": 300}]}, "big.yaml")
    with pytest.raises(
        InputError,
        match=r"big.yaml: datacenters\[0\].gpus: 300 GPU hosts; "
        r"the emulator holds at most 240",
    ):
        check_limits(topology)


def test_delay_line_release_is_never_early_and_never_reorders() -> None:
    port = Port("d-x", delay_s=0.010, jitter_s=0.004, seed=3)
    port.rng = random.Random(3)
    releases = [port.release_time(now=i * 0.0001) for i in range(2000)]
    assert releases == sorted(releases)
    assert all(r >= i * 0.0001 + 0.006 - 1e-12 for i, r in enumerate(releases))
    fixed = Port("d-y", delay_s=0.020)
    assert fixed.release_time(1.0) == pytest.approx(1.020)


def test_delay_line_offloads_only_without_loss() -> None:
    assert Port("d-x", 0.01).offloads
    assert not Port("d-x", 0.01, loss=0.01).offloads


def test_window_limit_arithmetic() -> None:
    from testbed.emulator.net.check import window_limit_bps

    assert math.isclose(window_limit_bps(4 * 1024**2, 0.1), 335544320.0)


@given(topologies(), st.integers(0, 63))
def test_no_topology_names_a_scratch_namespace(topology: Any, slot: int) -> None:
    """`down` removes scratch namespaces of exited makers; a topology cannot name one."""
    from testbed.emulator.net.state import PROBE_PREFIX

    assert not any(ns.startswith(PROBE_PREFIX) for ns in build_layout(topology, slot)
                   .namespaces())


def test_a_scratch_namespace_is_stale_only_once_its_maker_is_gone() -> None:
    import os
    import subprocess
    import sys

    from testbed.emulator.net.state import probe_namespace, stale_probe

    mine = probe_namespace()
    assert not stale_probe(mine)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    assert stale_probe(f"tb.probe-{gone.stdout.strip()}-1")
    assert stale_probe(f"tb.probe-{os.getpid()}-1")  # same pid, another process's start
    for name in ("tbprobe", "tbprobe-0", "tbprobe4242", "tb.probe-x-1", "east-0"):
        assert not stale_probe(name)
