"""The emulated network as plain data: namespaces, interfaces, addresses, routes, shapes.

Pure functions of the topology and a run slot, so the whole network can be checked without
root. Each GPU host is a namespace with one veth to its DC's router namespace; routers are
joined pairwise by WAN veths. Slot 0 names host namespaces exactly like the hosts
(`east-0`); a concurrent run gets slot k > 0, the prefix `tb<k>-` and its own addresses.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass

from testbed.errors import InputError
from testbed.topology.limits import MAX_SLOTS
from testbed.topology.model import Topology

MAX_DCS = 250
MAX_HOSTS_PER_DC = 240
HOST_IF = "eth0"
DEFAULT_MTU = 1500
MIN_QUEUE_BYTES = 256 * 1024


def prefix_for(slot: int) -> str:
    return "" if slot == 0 else f"tb{slot}-"


def _second_octet(slot: int) -> int:
    return 64 + slot


@dataclass(frozen=True)
class Shape:
    """What one direction of a link does to packets."""

    rate_bps: float
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0
    queue_bytes: int = MIN_QUEUE_BYTES

    @property
    def bdp_bytes(self) -> int:
        return math.ceil(self.rate_bps * 2 * self.delay_s / 8)


@dataclass(frozen=True)
class Node:
    """A GPU host."""

    name: str
    dc: str
    netns: str
    address: str
    router_address: str
    uplink: Shape
    """Host to router direction (egress of the host's eth0)."""
    downlink: Shape
    """Router to host direction (egress of the router's h<i>)."""
    router_if: str


@dataclass(frozen=True)
class Router:
    dc: str
    netns: str
    address: str
    subnet: str


@dataclass(frozen=True)
class WanPort:
    """One router's end of a WAN link, and the direction leaving through it."""

    dc: str
    peer: str
    ifname: str
    tun: str
    address: str
    peer_address: str
    out: Shape
    table: int
    """Policy-routing table that sends delayed packets on to the peer (userspace shaper)."""


@dataclass(frozen=True)
class Tunnel:
    """A WAN port whose peer router is on another machine: a VXLAN interface named like
    the port, over the cluster network (testbed.emulator.net.share)."""

    dc: str
    peer: str
    ifname: str
    vni: int
    local: str
    """This machine's address on the cluster network."""
    remote: str
    """The peer router's machine's."""
    port: int
    underlay_netns: str | None
    """The namespace holding `local`; None: the machine's own network."""


@dataclass(frozen=True)
class Layout:
    slot: int
    prefix: str
    nodes: tuple[Node, ...]
    routers: tuple[Router, ...]
    ports: tuple[WanPort, ...]
    routes: dict[str, dict[str, str]]
    """Per router DC: destination DC -> next-hop peer DC."""
    tunnels: tuple[Tunnel, ...] = ()
    mtu: int = DEFAULT_MTU
    """Of every interface (lower under tunnels: a packet must fit in one tunnel packet)."""
    hosts_text: str | None = None
    """The hosts file, when it names more than this layout (a machine's share of one)."""
    machine: str | None = None
    """The cluster machine this share is for; None: the whole network, here."""
    subnets: dict[str, str] | None = None
    """Every DC's subnet, when routers elsewhere are not in `routers`."""

    @property
    def router_dcs(self) -> set[str]:
        """The DCs whose routers this layout makes (a machine's share: its own)."""
        return {router.dc for router in self.routers}

    def subnet(self, dc: str) -> str:
        """The DC's host subnet, wherever its router is."""
        return self.subnets[dc] if self.subnets is not None else self.router(dc).subnet

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)

    def router(self, dc: str) -> Router:
        for router in self.routers:
            if router.dc == dc:
                return router
        raise KeyError(dc)

    def ports_of(self, dc: str) -> list[WanPort]:
        return [port for port in self.ports if port.dc == dc]

    def port(self, dc: str, peer: str) -> WanPort:
        for port in self.ports:
            if port.dc == dc and port.peer == peer:
                return port
        raise KeyError((dc, peer))

    def namespaces(self) -> list[str]:
        return [n.netns for n in self.nodes] + [r.netns for r in self.routers]

    def hosts_file(self) -> str:
        if self.hosts_text is not None:
            return self.hosts_text
        lines = ["127.0.0.1 localhost", "::1 localhost"]
        lines += [f"{r.address} r-{r.dc}" for r in self.routers]
        lines += [f"{n.address} {n.name}" for n in self.nodes]
        return "\n".join(lines) + "\n"


def check_limits(topology: Topology) -> None:
    """Refuse, before anything is created, what this addressing cannot hold."""
    if len(topology.datacenters) > MAX_DCS:
        raise InputError(
            f"{len(topology.datacenters)} datacenters; the emulator holds at most {MAX_DCS}",
            topology.source,
            "datacenters",
        )
    for i, dc in enumerate(topology.datacenters):
        if dc.gpus > MAX_HOSTS_PER_DC:
            raise InputError(
                f"{dc.gpus} GPU hosts; the emulator holds at most "
                f"{MAX_HOSTS_PER_DC} per datacenter",
                topology.source,
                f"datacenters[{i}].gpus",
            )
    if len(topology.links) > 127:
        raise InputError(
            f"{len(topology.links)} WAN links; the emulator holds at most 127",
            topology.source,
            "wan",
        )


def host_link_shape(rate_bps: float, latency_s: float) -> Shape:
    """Half the DC's one-way latency on each host link, so host to host is the full latency."""
    one_way = latency_s / 2
    bdp = math.ceil(rate_bps * 2 * one_way / 8)
    return Shape(rate_bps, delay_s=one_way, queue_bytes=max(bdp, MIN_QUEUE_BYTES))


DECODE_OFFSET = 250
"""Decode servers sit at .250 of their DC's subnet."""


def build_layout(topology: Topology, slot: int = 0, decode_dcs: tuple[str, ...] = ()) -> Layout:
    """The network for `topology` in run slot `slot`, with a decode-server host in each of
    `decode_dcs` (named `<dc>-decode`)."""
    check_limits(topology)
    if not 0 <= slot < MAX_SLOTS:
        raise ValueError(f"slot {slot} outside 0..{MAX_SLOTS - 1}")
    prefix = prefix_for(slot)
    octet = _second_octet(slot)
    nodes: list[Node] = []
    routers: list[Router] = []
    for d, dc in enumerate(topology.datacenters):
        subnet = ipaddress.ip_network(f"10.{octet}.{d}.0/24")
        router_address = str(subnet.network_address + 1)
        routers.append(Router(dc.name, f"{prefix}r-{dc.name}", router_address, str(subnet)))
        shape = host_link_shape(dc.bandwidth_bps, dc.latency_s)
        for i in range(dc.gpus):
            nodes.append(
                Node(
                    name=f"{dc.name}-{i}",
                    dc=dc.name,
                    netns=f"{prefix}{dc.name}-{i}",
                    address=str(subnet.network_address + 10 + i),
                    router_address=router_address,
                    uplink=shape,
                    downlink=shape,
                    router_if=f"h{i}",
                )
            )
        if dc.name in decode_dcs:
            nodes.append(Node(
                name=f"{dc.name}-decode", dc=dc.name, netns=f"{prefix}{dc.name}-decode",
                address=str(subnet.network_address + DECODE_OFFSET),
                router_address=router_address, uplink=shape, downlink=shape, router_if="hd",
            ))
    ports: list[WanPort] = []
    for k, link in enumerate(topology.links):
        base = ipaddress.ip_address(f"10.{octet}.255.0") + 2 * k
        shape = Shape(
            link.bandwidth_bps, link.latency_s, link.jitter_s, link.loss, link.effective_queue_bytes
        )
        for here, peer, mine, theirs in (
            (link.a, link.b, base, base + 1),
            (link.b, link.a, base + 1, base),
        ):
            ports.append(
                WanPort(
                    dc=here,
                    peer=peer,
                    ifname=f"w-{peer}",
                    tun=f"d-{peer}",
                    address=str(mine),
                    peer_address=str(theirs),
                    out=shape,
                    table=100 + _dc_index(topology, peer),
                )
            )
    routes = {
        dc.name: {
            other.name: topology.path(dc.name, other.name)[1]
            for other in topology.datacenters
            if other.name != dc.name
        }
        for dc in topology.datacenters
    }
    return Layout(slot, prefix, tuple(nodes), tuple(routers), tuple(ports), routes)


def _dc_index(topology: Topology, name: str) -> int:
    return [dc.name for dc in topology.datacenters].index(name)
