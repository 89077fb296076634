"""One emulated WAN across machines, on this one machine: each "machine" is a network
namespace holding its cluster address, the machines joined by a bridge (the cluster
network); each brings up its share with `testbed net up --cluster F --machine NAME`.

Needs root. Bounds as for one machine (tests/test_net_root.py)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.emulator.net.check import iperf_bps, ping_rtts
from testbed.emulator.net.layout import Layout, build_layout
from testbed.emulator.net.namespace_cluster import namespace_machines
from testbed.emulator.net.netns import list_namespaces
from testbed.emulator.net.slots import free_slot
from testbed.topology.load import load_topology
from tests.conftest import machine_prefix

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("clean_host")]



PAIR = (
    "tcp: {congestion: cubic}\n"
    "datacenters:\n  - {name: east, gpus: 1}\n  - {name: west, gpus: 1}\n"
    "wan:\n  - {between: [east, west], latency: 20ms, bandwidth: 100Mbit}\n")


@pytest.fixture
def machines() -> Iterator[dict[str, str]]:
    """Machines m1 and m2: namespaces on one bridge (the cluster network), named for this
    process so that another run of the suite on the host does not collide."""
    with namespace_machines(["m1", "m2"], prefix=machine_prefix()) as made:
        yield {m.name: m.netns for m in made}


def _write(tmp_path: Path, machines: dict[str, str]) -> tuple[Path, Path, Layout]:
    """The pair topology and its cluster file, in a slot nothing on this host holds."""
    topology = tmp_path / "pair.yaml"
    topology.write_text(PAIR)
    parsed = load_topology(topology)
    slot = free_slot(lambda s: build_layout(parsed, s))
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(json.dumps({"slot": slot, "machines": [
        {"name": "m1", "address": "10.251.0.1", "netns": machines["m1"], "dcs": ["east"]},
        {"name": "m2", "address": "10.251.0.2", "netns": machines["m2"], "dcs": ["west"]},
    ]}))
    return topology, cluster, build_layout(parsed, slot)


def _names(layout: Layout, dc: str) -> set[str]:
    """The namespaces of `dc`'s host and router in `layout`."""
    return ({n.netns for n in layout.nodes if n.dc == dc}
            | {r.netns for r in layout.routers if r.dc == dc})


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from testbed.cli.main import main; main()",
                           *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_two_machines_make_one_wan_and_each_removes_only_its_share(
        tmp_path: Path, machines: dict[str, str]) -> None:
    topology, cluster, layout = _write(tmp_path, machines)
    east, west = _names(layout, "east"), _names(layout, "west")
    east_host, west_host = (next(n for n in layout.nodes if n.dc == dc) for dc in ("east", "west"))
    try:
        for name in ("m1", "m2"):
            up = _cli("net", "up", str(topology), "--cluster", str(cluster), "--machine", name,
                      "--detach")
            assert up.returncode == 0, up.stderr
        assert east | west <= set(list_namespaces())
        rtts = ping_rtts(east_host.netns, west_host.address, count=20, interval_s=0.01)
        assert min(rtts) >= 0.040, min(rtts)
        assert statistics.median(rtts) <= 0.040 + 0.0025 + 0.02 * 0.040, rtts
        # 2 s after iperf's omitted first second (slow start at 40 ms is over in 0.3 s)
        rate = iperf_bps(east_host.netns, west_host.netns, west_host.address, streams=4,
                         seconds=2)
        assert 0.8e8 <= rate <= 1.02e8, rate
        listing = _cli("net", "ls", "--json")
        info: Any = json.loads(listing.stdout)
        networks = [n for n in info.get("networks", [info]) if n["slot"] == layout.slot]
        runs = {n["cluster"]["machine"]: n["run_id"] for n in networks}
        assert set(runs) == {"m1", "m2"}
        assert all(len(n["cluster"]["machines"]) == 2 for n in networks)
        first = _cli("down", runs["m1"])  # m1's share only
        assert first.returncode == 0, first.stderr
        left = set(list_namespaces())
        assert not east & left and west <= left
    finally:
        down = _cli("down")
    assert down.returncode == 0, down.stderr
    assert not (east | west) & set(list_namespaces())
    assert set(machines.values()) <= set(list_namespaces())  # not a run's


def test_a_tunnel_that_cannot_be_made_fails_in_one_line_and_leaves_nothing(
        tmp_path: Path, machines: dict[str, str]) -> None:
    topology, cluster, _ = _write(tmp_path, {"m1": "tbcl-absent", "m2": machines["m2"]})
    before = set(list_namespaces())
    up = _cli("net", "up", str(topology), "--cluster", str(cluster), "--machine", "m1",
              "--detach")
    assert up.returncode == 1, up.stderr
    last = up.stderr.strip().splitlines()[-1]
    assert last.startswith("testbed: error: tunnel east -> west to 10.251.0.2:"), up.stderr
    assert "Traceback" not in up.stderr
    assert set(list_namespaces()) == before


def test_a_killed_share_is_removed_by_down(tmp_path: Path, machines: dict[str, str]) -> None:
    topology, cluster, layout = _write(tmp_path, machines)
    west = _names(layout, "west")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from testbed.cli.main import main; main()", "net", "up",
         str(topology), "--cluster", str(cluster), "--machine", "m2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "network is up" in line:
            break
    assert west <= set(list_namespaces())
    proc.kill()
    proc.wait(timeout=10)
    down = _cli("down")
    assert down.returncode == 0, down.stderr
    assert not west & set(list_namespaces())
