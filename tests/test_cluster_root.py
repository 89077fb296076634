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

from testbed.net.check import iperf_bps, ping_rtts
from testbed.net.namespace_cluster import namespace_machines
from testbed.net.netns import list_namespaces

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("clean_host")]



@pytest.fixture
def machines() -> Iterator[dict[str, str]]:
    """Machines m1 and m2: namespaces tbcl-m1, tbcl-m2 on one bridge (the cluster network)."""
    with namespace_machines(["m1", "m2"]) as made:
        yield {m.name: m.netns for m in made}


def _write(tmp_path: Path, machines: dict[str, str]) -> tuple[Path, Path]:
    topology = tmp_path / "pair.yaml"
    topology.write_text(
        "tcp: {congestion: cubic}\n"
        "datacenters:\n  - {name: east, gpus: 1}\n  - {name: west, gpus: 1}\n"
        "wan:\n  - {between: [east, west], latency: 20ms, bandwidth: 100Mbit}\n")
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(json.dumps({"machines": [
        {"name": "m1", "address": "10.251.0.1", "netns": machines["m1"], "dcs": ["east"]},
        {"name": "m2", "address": "10.251.0.2", "netns": machines["m2"], "dcs": ["west"]},
    ]}))
    return topology, cluster


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from testbed.cli import main; main()", *args],
                          capture_output=True, text=True, timeout=120, check=False)


def test_two_machines_make_one_wan_and_each_removes_only_its_share(
        tmp_path: Path, machines: dict[str, str]) -> None:
    topology, cluster = _write(tmp_path, machines)
    ours = {"east-0", "r-east", "west-0", "r-west"}
    try:
        for name in ("m1", "m2"):
            up = _cli("net", "up", str(topology), "--cluster", str(cluster), "--machine", name,
                      "--detach")
            assert up.returncode == 0, up.stderr
        assert ours <= set(list_namespaces())
        rtts = ping_rtts("east-0", "10.64.1.10", count=20, interval_s=0.01)
        assert min(rtts) >= 0.040, min(rtts)
        assert statistics.median(rtts) <= 0.040 + 0.0025 + 0.02 * 0.040, rtts
        rate = iperf_bps("east-0", "west-0", "10.64.1.10", streams=4, seconds=3)
        assert 0.8e8 <= rate <= 1.02e8, rate
        listing = _cli("net", "ls", "--json")
        info: Any = json.loads(listing.stdout)
        networks = info.get("networks", [info])
        runs = {n["cluster"]["machine"]: n["run_id"] for n in networks}
        assert set(runs) == {"m1", "m2"}
        assert all(len(n["cluster"]["machines"]) == 2 for n in networks)
        first = _cli("down", runs["m1"])  # m1's share only
        assert first.returncode == 0, first.stderr
        left = set(list_namespaces())
        assert not {"east-0", "r-east"} & left and {"west-0", "r-west"} <= left
    finally:
        down = _cli("down")
    assert down.returncode == 0, down.stderr
    assert not ours & set(list_namespaces())
    assert {"tbcl-m1", "tbcl-m2", "tbcl-lan"} <= set(list_namespaces())  # not a run's


def test_a_tunnel_that_cannot_be_made_fails_in_one_line_and_leaves_nothing(
        tmp_path: Path, machines: dict[str, str]) -> None:
    topology, cluster = _write(tmp_path, {"m1": "tbcl-absent", "m2": machines["m2"]})
    before = set(list_namespaces())
    up = _cli("net", "up", str(topology), "--cluster", str(cluster), "--machine", "m1",
              "--detach")
    assert up.returncode == 1, up.stderr
    last = up.stderr.strip().splitlines()[-1]
    assert last.startswith("testbed: error: tunnel east -> west to 10.251.0.2:"), up.stderr
    assert "Traceback" not in up.stderr
    assert set(list_namespaces()) == before


def test_a_killed_share_is_removed_by_down(tmp_path: Path, machines: dict[str, str]) -> None:
    topology, cluster = _write(tmp_path, machines)
    proc = subprocess.Popen(
        [sys.executable, "-c", "from testbed.cli import main; main()", "net", "up",
         str(topology), "--cluster", str(cluster), "--machine", "m2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "network is up" in line:
            break
    assert {"west-0", "r-west"} <= set(list_namespaces())
    proc.kill()
    proc.wait(timeout=10)
    down = _cli("down")
    assert down.returncode == 0, down.stderr
    assert not {"west-0", "r-west"} & set(list_namespaces())
