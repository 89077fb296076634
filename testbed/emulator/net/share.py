"""One machine's share of an emulated WAN that spans a cluster.

Pure, like testbed.emulator.net.layout: the whole network is laid out as on one machine (the same
names and addresses everywhere, so every machine agrees on them), then each machine keeps
its own DCs' hosts, routers and WAN ports. A port whose peer router is on another machine
becomes a VXLAN tunnel over the cluster network instead of a veth: layer 2, so the
routers address each other exactly as across a veth, and each router shapes what leaves
through it exactly as on one machine, so rate and delay hold end to end. (VXLAN because
it is what this kernel and most clusters have: GRE, geneve and WireGuard modules are
often missing, and a layer-3 tunnel would need its own addressing.)
"""

from __future__ import annotations

from dataclasses import replace

from testbed.emulator.net.layout import Layout, Tunnel
from testbed.emulator.net.state import ClusterListing
from testbed.topology.cluster import Cluster
from testbed.topology.model import Topology

VNI_BASE = 4200
"""VXLAN network identifiers start here: slot k, link i get VNI_BASE + 128 k + i."""


def machine_share(topology: Topology, layout: Layout, cluster: Cluster, machine: str
                  ) -> Layout:
    """What `machine` creates of `layout`: its DCs' hosts, routers and ports, tunnels for
    ports whose peer is elsewhere, every interface at the tunnels' inner MTU, and a hosts
    file naming every host of the cluster."""
    here = cluster.machine(machine)
    local = set(here.dcs)
    tunnels = []
    for port in layout.ports:
        if port.dc in local and port.peer not in local:
            there = cluster.machine_of(port.peer)
            tunnels.append(Tunnel(port.dc, port.peer, port.ifname,
                                  vni=VNI_BASE + 128 * layout.slot + _link_index(topology,
                                                                                 port.dc,
                                                                                 port.peer),
                                  local=here.address, remote=there.address, port=cluster.port,
                                  underlay_netns=here.netns))
    return replace(
        layout,
        nodes=tuple(n for n in layout.nodes if n.dc in local),
        routers=tuple(r for r in layout.routers if r.dc in local),
        ports=tuple(p for p in layout.ports if p.dc in local),
        routes={dc: hops for dc, hops in layout.routes.items() if dc in local},
        tunnels=tuple(tunnels),
        mtu=cluster.inner_mtu,
        hosts_text=layout.hosts_file(),
        machine=machine,
        subnets={r.dc: r.subnet for r in layout.routers},
    )


def vxlan_command(tunnel: Tunnel, router_netns: str, mtu: int) -> list[str]:
    """The `ip` command that creates the tunnel's interface directly in the router's
    namespace; its UDP socket stays where the cluster address is (the underlay)."""
    where = ["-n", tunnel.underlay_netns] if tunnel.underlay_netns else []
    return ["ip", *where, "link", "add", tunnel.ifname, "netns", router_netns, "mtu", str(mtu),
            "type", "vxlan", "id", str(tunnel.vni), "local", tunnel.local,
            "remote", tunnel.remote, "dstport", str(tunnel.port)]


def _link_index(topology: Topology, a: str, b: str) -> int:
    for i, link in enumerate(topology.links):
        if {link.a, link.b} == {a, b}:
            return i
    raise KeyError((a, b))


def describe_cluster(cluster: Cluster, layout: Layout) -> ClusterListing:
    """The `net ls --json` form of the cluster a share belongs to."""
    return {"name": cluster.name, "machine": layout.machine,
            "coordinator": cluster.coordinator, "mtu": layout.mtu,
            "machines": [{"name": m.name, "address": m.address, "dcs": list(m.dcs)}
                         for m in cluster.machines],
            "tunnels": [{"dc": t.dc, "peer": t.peer, "vni": t.vni, "remote": t.remote}
                        for t in layout.tunnels]}
