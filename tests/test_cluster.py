"""Cluster files and each machine's share of the network, without root."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testbed.emulator.net.layout import build_layout
from testbed.emulator.net.share import VNI_BASE, machine_share, vxlan_command
from testbed.errors import InputError
from testbed.topology import load_topology
from testbed.topology.cluster import parse_cluster

from .test_cli import call

ROOT = Path(__file__).resolve().parent.parent
PAPER = load_topology(ROOT / "topologies" / "paper-3dc.yaml")


def _cluster(**extra: Any) -> dict[str, Any]:
    return {"machines": [
        {"name": "m1", "address": "192.168.50.1", "dcs": ["east", "central"]},
        {"name": "m2", "address": "192.168.50.2", "dcs": ["west"], "gpus": 4},
    ], **extra}


def test_a_cluster_places_every_dc_once() -> None:
    cluster = parse_cluster(_cluster(), "c.yaml", PAPER)
    assert cluster.coordinator == "m1"
    assert cluster.machine_of("west").name == "m2"
    assert cluster.inner_mtu == 1450


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: c["machines"][1].update(dcs=["west", "east"]),
     "c.yaml: machines[1].dcs[1]: datacenter 'east' is already on machine 'm1'"),
    (lambda c: c["machines"][1].update(dcs=["central"]) or
     c["machines"][0].update(dcs=["east"]),
     "c.yaml: machines: datacenter west of"),
    (lambda c: c["machines"][1].update(dcs=["north"]),
     "c.yaml: machines[1].dcs[0]: no datacenter 'north' in"),
    (lambda c: c["machines"][1].update(gpus=2),
     "c.yaml: machines[1].gpus: its DCs have 4 GPU hosts, more than its 2"),
    (lambda c: c["machines"][1].update(address="192.168.50.1"),
     "c.yaml: machines[1].address: address 192.168.50.1 given twice"),
    (lambda c: c["machines"][1].update(address="192.168.50"),
     "c.yaml: machines[1].address:"),
    (lambda c: c["machines"][1].update(name="m1"),
     "c.yaml: machines[1].name: machine 'm1' given twice"),
    (lambda c: c.update(coordinator="m9"), "c.yaml: coordinator: 'm9' is not one of"),
    (lambda c: c.update(mtu=1000), "c.yaml: mtu: must be 1330-65535"),
    (lambda c: c["machines"][0].update(colour="red"), "c.yaml: machines[0]"),
    (lambda c: c.update(control_port=29400), "c.yaml: control_port: is also the "
     "rendezvous_port"),
    (lambda c: c.update(rendezvous_port=70000), "c.yaml: rendezvous_port: expected a port"),
])
def test_a_bad_cluster_file_says_where(change: Any, message: str) -> None:
    data = _cluster()
    change(data)
    with pytest.raises(InputError) as caught:
        parse_cluster(data, "c.yaml", PAPER)
    assert str(caught.value).startswith(message), str(caught.value)
    assert "\n" not in str(caught.value)


def test_each_machine_makes_its_own_dcs_and_tunnels_to_the_others() -> None:
    cluster = parse_cluster(_cluster(slot=2), "c.yaml", PAPER)
    layout = build_layout(PAPER, cluster.slot)
    first = machine_share(PAPER, layout, cluster, "m1")
    second = machine_share(PAPER, layout, cluster, "m2")
    assert {n.dc for n in first.nodes} == {"east", "central"}
    assert {r.dc for r in second.routers} == {"west"}
    assert len(first.nodes) + len(second.nodes) == len(layout.nodes)
    # east <-> central stays a veth on m1; every link to west is a tunnel at both ends
    assert {(t.dc, t.peer) for t in first.tunnels} == {("east", "west"), ("central", "west")}
    assert {(t.dc, t.peer) for t in second.tunnels} == {("west", "east"), ("west", "central")}
    ends = {(t.dc, t.peer): t for t in first.tunnels + second.tunnels}
    for (a, b), tunnel in ends.items():
        other = ends[(b, a)]
        assert tunnel.vni == other.vni and tunnel.vni >= VNI_BASE + 2 * 128
        assert (tunnel.local, tunnel.remote) == (other.remote, other.local)
    assert len({t.vni for t in first.tunnels}) == 2
    # every machine resolves every host of the cluster, and agrees on its address
    assert first.hosts_file() == second.hosts_file() == layout.hosts_file()
    assert first.mtu == 1450
    command = vxlan_command(first.tunnels[0], first.router("east").netns, first.mtu)
    assert command[:4] == ["ip", "link", "add", "w-west"]
    assert command[-6:] == \
        ["local", "192.168.50.1", "remote", "192.168.50.2", "dstport", "4789"]


def test_net_up_refuses_a_bad_cluster_file_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "cluster.yaml"
    bad.write_text("machines:\n  - {name: m1, address: 10.0.0.1, dcs: [east]}\n")
    code, out, err = call(["net", "up", str(ROOT / "topologies" / "paper-3dc.yaml"),
                           "--cluster", str(bad), "--machine", "m1"])
    assert code == 2, out + err
    assert "cluster.yaml: machines: datacenters central, west of" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
