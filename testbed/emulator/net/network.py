"""Bringing an emulated WAN up and down: the one place the network plan meets the kernel.

Everything a run will create is written to its state file before it is created, so that
`testbed down` can remove what a killed run left. Teardown runs in reverse order and
keeps going past errors.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from testbed.common.jsonio import read_json
from testbed.common.owners import process_start_ticks
from testbed.common.units import plural
from testbed.emulator.net import netns as kernel
from testbed.emulator.net.delayline import DelayLineStats
from testbed.emulator.net.interrupts import critical, stop_point
from testbed.emulator.net.layout import HOST_IF, Layout, build_layout
from testbed.emulator.net.shaping import Shaper, ShapingPlan, plan_shaping
from testbed.emulator.net.share import describe_cluster, machine_share, vxlan_command
from testbed.emulator.net.slots import free_slot, refuse_taken_names
from testbed.emulator.net.state import (
    LinkListing,
    NetInfo,
    ProcessRecord,
    RunState,
    new_run_id,
    state_lock,
)
from testbed.emulator.net.teardown import ALLOWED_CC, clean_state
from testbed.errors import InputError, NetworkError
from testbed.plan.pacing import PACING_RATIO
from testbed.topology.cluster import Cluster
from testbed.topology.model import Topology

Progress = Callable[[str], None]
TUN_TXQUEUELEN = 10000
DELAYLINE_READY_S = 10.0
ROUTER_SYSCTLS = {
    "net.ipv4.ip_forward": "1",
    "net.ipv4.conf.all.rp_filter": "0",
    "net.ipv4.conf.default.rp_filter": "0",
    "net.ipv6.conf.all.disable_ipv6": "1",
    "net.ipv6.conf.default.disable_ipv6": "1",
}
HOST_SYSCTLS = {
    "net.ipv6.conf.all.disable_ipv6": "1",
    "net.ipv6.conf.default.disable_ipv6": "1",
    # a paced socket (testbed.plan.pacing) is also paced at a multiple of cwnd/srtt; unpaced
    # sockets and BBR (which sets its own rate) do not use these
    "net.ipv4.tcp_pacing_ss_ratio": str(round(PACING_RATIO * 100)),
    "net.ipv4.tcp_pacing_ca_ratio": str(round(PACING_RATIO * 100)),
}


def choose_shaper(requested: str) -> Shaper:
    """`auto` takes netem where the kernel has it; `netem` on a kernel without it fails."""
    if requested == Shaper.USERSPACE:
        return Shaper.USERSPACE
    available = kernel.netem_available()
    if requested == Shaper.NETEM and not available:
        raise NetworkError(
            "--shaper netem: this kernel has no netem qdisc (sch_netem); "
            "use --shaper userspace or auto"
        )
    return Shaper.NETEM if available else Shaper.USERSPACE


@dataclass
class Network:
    """A running emulated WAN."""

    topology: Topology
    layout: Layout
    shaper: Shaper
    shaping: ShapingPlan
    state: RunState
    delay_lines: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    stats_dir: Path | None = None
    current: dict[tuple[str, str], dict[str, float]] = field(default_factory=dict)
    """Link settings changed by events, per direction."""
    cluster: Cluster | None = None
    """When this is one machine's share of a cluster's network."""

    def netns_of(self, node: str) -> str:
        return self.layout.node(node).netns

    def address_of(self, node: str) -> str:
        return self.layout.node(node).address

    def describe(self) -> NetInfo:
        """The `net ls --json` form: nodes, links, and what shapes them."""
        links: list[LinkListing] = []
        for link in self.topology.links:
            links.append(
                {
                    "between": [link.a, link.b],
                    "latency_ms": link.latency_s * 1e3,
                    "bandwidth_bps": link.bandwidth_bps,
                    "jitter_ms": link.jitter_s * 1e3,
                    "loss": link.loss,
                    "queue_bytes": link.effective_queue_bytes,
                    "shaper": self.shaper.value,
                }
            )
        listing: NetInfo = {
            "run_id": self.state.run_id,
            "topology": self.topology.name,
            "shaper": self.shaper.value,
            "slot": self.layout.slot,
            "nodes": [
                {"name": n.name, "dc": n.dc, "address": n.address, "netns": n.netns}
                for n in self.layout.nodes
            ],
            "routers": [
                {"dc": r.dc, "address": r.address, "netns": r.netns, "subnet": r.subnet}
                for r in self.layout.routers
            ],
            "links": links,
            "tcp": {
                dc.name: self.topology.tcp_for(dc.name).sysctls()
                for dc in self.topology.datacenters
            },
            "notes": list(self.shaping.notes),
        }
        if self.cluster is not None:
            listing["cluster"] = describe_cluster(self.cluster, self.layout)
        return listing

    def delay_line_stats(self) -> dict[str, DelayLineStats]:
        """Counters and CPU time of each delay line (userspace shaper only), as its
        process wrote them."""
        out: dict[str, DelayLineStats] = {}
        if self.stats_dir is None:
            return out
        for proc in self.delay_lines.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(0.05)
        for key in self.delay_lines:
            path = self.stats_dir / f"delayline-{key}.json"
            with contextlib.suppress(InputError):
                out[key] = read_json(path)
        return out


def bring_up(
    topology: Topology,
    shaper: str = "auto",
    progress: Progress | None = None,
    detached: bool = False,
    seed: int = 0,
    decode_dcs: tuple[str, ...] = (),
    cluster: Cluster | None = None,
    machine: str | None = None,
) -> Network:
    """Create the whole network (with decode-server hosts in `decode_dcs`), or with a
    `cluster`, `machine`'s share of it; on any failure remove what was made and
    re-raise."""
    say = progress or (lambda _msg: None)
    started = time.monotonic()
    with critical():  # a stop signal lands between steps, never in one (net.interrupts)
        chosen = choose_shaper(shaper)
        stop_point()
        network = _recorded(topology, chosen, detached, seed, decode_dcs, cluster, machine)
        try:
            _build(network, say)
            network.state.ready = True
            # what bring-up saved for teardown (the host's sysctl before ours) stays
            network.state.info = {**network.state.info, **network.describe()}
            network.state.save()
        except BaseException:
            tear_down(network)
            raise
    say(
        f"network up in {time.monotonic() - started:.1f} s: "
        f"{plural(len(network.layout.nodes), 'host')}, "
        f"{plural(len(network.layout.routers), 'router')}, shaper {chosen.value}"
    )
    return network


def _recorded(topology: Topology, chosen: Shaper, detached: bool, seed: int,
              decode_dcs: tuple[str, ...], cluster: Cluster | None, machine: str | None
              ) -> Network:
    """The network to make, its state file written before anything is made."""
    with state_lock():
        if cluster is not None and machine is not None:
            layout = machine_share(topology, build_layout(topology, cluster.slot, decode_dcs),
                                   cluster, machine)
            refuse_taken_names(layout)
            slot = cluster.slot
        else:
            slot = free_slot(lambda s: build_layout(topology, s, decode_dcs))
            layout = build_layout(topology, slot, decode_dcs)
        shaping = plan_shaping(layout, chosen, seed)
        namespaces = layout.namespaces()
        state = RunState(
            run_id=new_run_id(),
            slot=slot,
            prefix=layout.prefix,
            topology=topology.name,
            shaper=chosen.value,
            namespaces=namespaces,
            etc_dirs=[str(kernel.ETC_NETNS / ns) for ns in namespaces],
            owner_pid=os.getpid(),
            owner_ticks=process_start_ticks(os.getpid()) or 0,
            detached=detached,
        )
        state.save()
    return Network(topology, layout, chosen, shaping, state, cluster=cluster)


def _build(network: Network, say: Progress) -> None:
    layout, topology = network.layout, network.topology
    say(f"creating {plural(len(layout.namespaces()), 'namespace')} (shaper "
        f"{network.shaper.value})")
    for ns in layout.namespaces():
        stop_point()
        kernel.create_namespace(ns)
        kernel.write_etc_files(ns, layout.hosts_file())
    _allow_congestion_controls(network)
    with kernel.Namespaces() as k:
        for ns in layout.namespaces():
            k.up(ns, "lo")
        mtu = layout.mtu
        for router in layout.routers:
            kernel.set_sysctls(router.netns, ROUTER_SYSCTLS)
        for node in layout.nodes:
            stop_point()
            router = layout.router(node.dc)
            k.veth(node.netns, HOST_IF, router.netns, node.router_if)
            k.up(node.netns, HOST_IF, mtu=mtu)
            k.up(router.netns, node.router_if, mtu=mtu)
            k.address(node.netns, HOST_IF, node.address, 32)
            k.route(node.netns, f"{node.router_address}/32", HOST_IF, link_scope=True)
            k.route(node.netns, "0.0.0.0/0", HOST_IF, gateway=node.router_address)
            k.address(router.netns, node.router_if, router.address, 32)
            k.route(router.netns, f"{node.address}/32", node.router_if, link_scope=True)
            tcp = topology.tcp_for(node.dc)
            kernel.set_sysctls(node.netns, {**HOST_SYSCTLS, **_tcp_sysctls(tcp.sysctls())})
        here = layout.router_dcs
        for port in layout.ports:
            if port.dc < port.peer and port.peer in here:
                peer = layout.port(port.peer, port.dc)
                k.veth(
                    layout.router(port.dc).netns,
                    port.ifname,
                    layout.router(port.peer).netns,
                    peer.ifname,
                )
        for tunnel in layout.tunnels:
            say(f"tunnel {tunnel.dc} -> {tunnel.peer}: VXLAN {tunnel.vni} to {tunnel.remote}")
            kernel.run_ip(vxlan_command(tunnel, layout.router(tunnel.dc).netns, mtu),
                          f"tunnel {tunnel.dc} -> {tunnel.peer} to {tunnel.remote}")
        for port in layout.ports:
            ns = layout.router(port.dc).netns
            k.up(ns, port.ifname, mtu=mtu)
            k.address(ns, port.ifname, port.address, 31)
            if network.shaper is Shaper.USERSPACE:
                k.ns(ns).link("add", ifname=port.tun, kind="tuntap", mode="tun")
                k.up(ns, port.tun, mtu=mtu, txqueuelen=TUN_TXQUEUELEN)
        _routes(network, k)
        stop_point()
        say("shaping links")
        for qdisc in network.shaping.qdiscs:
            k.qdisc(qdisc)
    if network.shaping.delay_lines:
        stop_point()
        _start_delay_lines(network, say)
    for note in network.shaping.notes:
        say(f"note: {note}")
    stop_point()


def _tcp_sysctls(values: dict[str, str]) -> dict[str, str]:
    """Per-namespace TCP settings; core.*mem_max are not writable inside a namespace and
    TCP autotuning is bounded by tcp_rmem/tcp_wmem alone."""
    return {k: v for k, v in values.items() if k.startswith("net.ipv4.")}


def _routes(network: Network, k: kernel.Namespaces) -> None:
    layout = network.layout
    for router in layout.routers:
        for dst_dc, hop in layout.routes[router.dc].items():
            port = layout.port(router.dc, hop)
            subnet = layout.subnet(dst_dc)
            if network.shaper is Shaper.USERSPACE:
                k.route(router.netns, subnet, port.tun)
            else:
                k.route(router.netns, subnet, port.ifname, gateway=port.peer_address)
        if network.shaper is Shaper.USERSPACE:
            for port in layout.ports_of(router.dc):
                # what the delay line writes back goes on to the peer router
                k.route(
                    router.netns,
                    "0.0.0.0/0",
                    port.ifname,
                    gateway=port.peer_address,
                    table=port.table,
                )
                k.rule_from_interface(router.netns, port.tun, port.table, priority=100)


def _start_delay_lines(network: Network, say: Progress) -> None:
    """One process per WAN direction: each gets its own core when one is free."""
    stats_dir = Path(network.state.path.with_suffix(""))
    stats_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    network.stats_dir = stats_dir
    say(f"starting {len(network.shaping.delay_lines)} delay lines")
    parent = 0 if network.state.detached else os.getpid()
    for spec in network.shaping.delay_lines:
        stop_point()
        port = {
            "name": spec.tun,
            "delay_s": spec.delay_s,
            "jitter_s": spec.jitter_s,
            "loss": spec.loss,
            "seed": spec.seed,
        }
        key = f"{spec.dc}>{spec.tun.removeprefix('d-')}"
        args = [
            "ip",
            "netns",
            "exec",
            spec.netns,
            sys.executable,
            "-m",
            "testbed.emulator.net.delayline",
            "--parent-pid",
            str(parent),
            "--stats",
            str(stats_dir / f"delayline-{key}.json"),
            "--port",
            json.dumps(port),
            "--control",
            str(stats_dir / f"delayline-{key}.control"),
        ]
        proc = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        network.delay_lines[key] = proc
        network.state.processes.append(
            ProcessRecord(proc.pid, process_start_ticks(proc.pid) or 0, f"delayline:{key}")
        )
        network.state.save()
    for key, proc in network.delay_lines.items():
        _await_ready(key, proc)


def _await_ready(dc: str, proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    import select

    ready, _, _ = select.select([proc.stdout], [], [], DELAYLINE_READY_S)
    line = proc.stdout.readline() if ready else ""
    if '"ready": true' not in line:
        proc.kill()
        _, err = proc.communicate(timeout=5)
        detail = (err or "").strip().splitlines()[-1:] or ["no output"]
        raise NetworkError(f"delay line for {dc} did not start: {detail[0]}")


def _allow_congestion_controls(network: Network) -> None:
    """A namespace may only pick a congestion control the host allows; add ours."""
    wanted = {network.topology.tcp_for(dc.name).congestion for dc in network.topology.datacenters}
    allowed = kernel.read_sysctl(ALLOWED_CC).split()
    missing = [cc for cc in sorted(wanted) if cc not in allowed]
    if missing:
        network.state.info["allowed_cc_before"] = " ".join(allowed)
        network.state.save()
        kernel.write_root_sysctl(ALLOWED_CC, " ".join(allowed + missing))


def tear_down(network: Network) -> list[str]:
    """Remove everything in reverse order; returns problems instead of stopping at them."""
    procs = {
        rec.pid: network.delay_lines.get(rec.role.split(":", 1)[-1])
        for rec in network.state.processes
    }
    with critical():  # a second signal does not cut teardown short
        return clean_state(network.state, procs)
