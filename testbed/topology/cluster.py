"""Which machine carries which datacenters when one emulated WAN spans several machines.

Pure data, validated against the topology like the topology itself: each machine has an
address on the cluster network (the network the machines share) and carries whole DCs,
their GPU hosts and router. A WAN link between DCs on different machines runs through a
VXLAN tunnel between the two routers over the cluster network (see testbed.emulator.net.share).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path

from testbed.common.fields import Fields, integer, positive, text
from testbed.common.yamlio import read_yaml
from testbed.errors import InputError
from testbed.topology.limits import MAX_SLOTS
from testbed.topology.model import Topology

MACHINE_NAME = re.compile(r"^[a-z][a-z0-9-]{0,31}$")
VXLAN_OVERHEAD = 50
"""Bytes VXLAN adds to each packet (outer IPv4 20, UDP 8, VXLAN 8, inner Ethernet 14)."""
VXLAN_PORT = 4789
CONTROL_PORT = 29410
"""TCP port of the coordinator's control channel on the cluster network."""
RENDEZVOUS_PORT = 29400
"""torchrun's c10d rendezvous port (torchrun's own default)."""
MIN_MTU = 1280 + VXLAN_OVERHEAD


@dataclass(frozen=True)
class Machine:
    name: str
    address: str
    """IPv4 address on the cluster network: tunnels and the control channel use it."""
    dcs: tuple[str, ...]
    """Datacenters it carries: their GPU hosts and router."""
    gpus: int | None = None
    """GPU hosts it can carry (its GPUs on a real cluster); None: no limit."""
    netns: str | None = None
    """Network namespace that holds `address`; None: the machine's own network."""


@dataclass(frozen=True)
class Cluster:
    name: str
    machines: tuple[Machine, ...]
    coordinator: str
    """The machine that runs the coordinator and keeps the results."""
    mtu: int = 1500
    """The cluster network's MTU; emulated interfaces get `mtu - VXLAN_OVERHEAD`."""
    port: int = VXLAN_PORT
    """UDP port of the tunnels."""
    slot: int = 0
    """Run slot of the cluster's network on every machine (names and addresses)."""
    secret: Path | None = None
    """A file every machine holds (mode 600): runs prove it on the control channel."""
    control_port: int = CONTROL_PORT
    rendezvous_port: int = RENDEZVOUS_PORT
    source: str | None = None

    def machine(self, name: str) -> Machine:
        for machine in self.machines:
            if machine.name == name:
                return machine
        known = ", ".join(m.name for m in self.machines)
        raise InputError(f"no machine {name!r} in the cluster (it has {known})", self.source,
                         "machines")

    def machine_of(self, dc: str) -> Machine:
        for machine in self.machines:
            if dc in machine.dcs:
                return machine
        raise KeyError(dc)

    @property
    def inner_mtu(self) -> int:
        """MTU of every emulated interface: a full packet must fit in one tunnel packet."""
        return self.mtu - VXLAN_OVERHEAD


def load_cluster(path: str | Path, topology: Topology) -> Cluster:
    return parse_cluster(read_yaml(path), str(path), topology)


def parse_cluster(data: object, source: str | None, topology: Topology) -> Cluster:
    """A cluster file: `machines` (each `name`, `address`, `dcs`, optional `gpus` and
    `netns`), optional `coordinator` (default: the first machine), `mtu`, `port`, `slot`,
    `secret` (a path, relative to the file), `control_port`, `rendezvous_port`."""
    top = Fields(data, source, keys=("name", "machines", "coordinator", "mtu", "port", "slot",
                                     "secret", "control_port", "rendezvous_port"))
    name = top.get("name", text, Path(source).stem if source else "cluster")
    machines: list[Machine] = []
    placed: dict[str, str] = {}
    for key, item in top.items("machines", required=True):
        machine = _machine(Fields(item, source, key, ("name", "address", "dcs", "gpus", "netns")),
                           topology, placed)
        if any(m.name == machine.name for m in machines):
            raise InputError(f"machine {machine.name!r} given twice", source, f"{key}.name")
        if any(m.address == machine.address and m.netns == machine.netns for m in machines):
            raise InputError(f"address {machine.address} given twice", source, f"{key}.address")
        machines.append(machine)
    if not machines:
        raise top.error("machines", "needs at least one machine")
    missing = [dc.name for dc in topology.datacenters if dc.name not in placed]
    if missing:
        raise top.error("machines", f"datacenter{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(missing)} of {topology.source or topology.name} "
                        "on no machine")
    coordinator = top.get("coordinator", text, machines[0].name)
    if coordinator not in {m.name for m in machines}:
        raise top.error("coordinator", f"{coordinator!r} is not one of the machines")
    mtu = top.get("mtu", positive(integer), 1500)
    if not MIN_MTU <= mtu <= 65535:
        raise top.error("mtu", f"must be {MIN_MTU}-65535 (a tunnel adds {VXLAN_OVERHEAD} "
                        "bytes to packets of at least 1280)")
    port = top.get("port", _port, VXLAN_PORT)
    slot = top.get("slot", _slot, 0)
    secret = top.get("secret", text, None)
    secret_path = None if secret is None else (
        Path(source).parent / secret if source else Path(secret))
    control_port = top.get("control_port", _port, CONTROL_PORT)
    rendezvous_port = top.get("rendezvous_port", _port, RENDEZVOUS_PORT)
    if control_port == rendezvous_port:
        raise top.error("control_port", f"is also the rendezvous_port ({rendezvous_port})")
    top.done()
    return Cluster(name, tuple(machines), coordinator, mtu, port, slot, secret_path,
                   control_port, rendezvous_port, source)


def _machine(fields: Fields, topology: Topology, placed: dict[str, str]) -> Machine:
    name = fields.get("name", text)
    if not MACHINE_NAME.match(name):
        raise fields.error("name", f"{name!r} is not a usable machine name (lower-case "
                           "letters, digits and '-', starting with a letter)")
    address = fields.get("address", _ipv4)
    dcs = tuple(fields.get("dcs", _names))
    known = {dc.name for dc in topology.datacenters}
    for i, dc in enumerate(dcs):
        if dc not in known:
            raise fields.error(f"dcs[{i}]", f"no datacenter {dc!r} in "
                               f"{topology.source or topology.name}")
        if dc in placed:
            raise fields.error(f"dcs[{i}]", f"datacenter {dc!r} is already on machine "
                               f"{placed[dc]!r}: each DC goes on one machine")
        placed[dc] = name
    gpus = fields.get("gpus", positive(integer), None)
    hosts = sum(topology.dc(dc).gpus for dc in dcs)
    if gpus is not None and hosts > gpus:
        raise fields.error("gpus", f"its DCs have {hosts} GPU hosts, more than its {gpus}")
    netns = fields.get("netns", text, None)
    fields.done()
    return Machine(name, address, dcs, gpus, netns)


def _ipv4(value: object) -> str:
    try:
        return str(ipaddress.IPv4Address(str(value)))
    except ValueError:
        raise ValueError(f"{value!r} is not an IPv4 address") from None


def _names(value: object) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise ValueError("expected a non-empty list of datacenter names")
    if len(set(value)) != len(value):
        raise ValueError("a datacenter is listed twice")
    return value


def _port(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 65535:
        raise ValueError("expected a port, 1-65535")
    return value


def _slot(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < MAX_SLOTS:
        raise ValueError(f"expected a run slot, 0-{MAX_SLOTS - 1}")
    return value


def dump_cluster(cluster: Cluster) -> dict[str, object]:
    """Plain data that `parse_cluster` reads back to an equal Cluster (but its secret,
    which each machine names for itself)."""
    return {"name": cluster.name, "coordinator": cluster.coordinator, "mtu": cluster.mtu,
            "port": cluster.port, "slot": cluster.slot, "control_port": cluster.control_port,
            "rendezvous_port": cluster.rendezvous_port,
            "machines": [{"name": m.name, "address": m.address, "dcs": list(m.dcs),
                          **({"gpus": m.gpus} if m.gpus is not None else {}),
                          **({"netns": m.netns} if m.netns is not None else {})}
                         for m in cluster.machines]}


def machine_at(cluster: Cluster, addresses: set[str]) -> str:
    """The machine whose cluster address is among `addresses` (this machine's own)."""
    found = [m.name for m in cluster.machines if m.netns is None and m.address in addresses]
    if len(found) != 1:
        raise InputError("cannot tell which machine this is (" + (
            f"{', '.join(found)} all have addresses here" if found else
            "none of the machines' addresses is on this machine") + "); pass --machine",
            cluster.source, "machines")
    return found[0]
