"""A cluster network of namespaces on one machine: each "machine" is a namespace holding
its cluster address, all joined by a bridge in a namespace of their own. Lets the tests,
the benchmark and a user try `--cluster` (set each machine's `netns:` in the cluster
file) where only one machine is at hand."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from testbed.emulator.net.netns import run_ip


@dataclass(frozen=True)
class NamespaceMachine:
    name: str
    netns: str
    address: str


def _ip(*args: str) -> None:
    run_ip(["ip", *args], "cluster network")


@contextmanager
def namespace_machines(names: list[str], prefix: str = "tbcl-", network: str = "10.251.0",
                       mtu: int = 1500) -> Iterator[list[NamespaceMachine]]:
    """Machines `<prefix><name>` at `<network>.<1..>`/24 on bridge br0 in `<prefix>lan`,
    links of `mtu`; all removed on the way out."""
    lan = f"{prefix}lan"
    machines = [NamespaceMachine(name, f"{prefix}{name}", f"{network}.{i + 1}")
                for i, name in enumerate(names)]
    try:
        _ip("netns", "add", lan)
        _ip("-n", lan, "link", "add", "br0", "type", "bridge")
        _ip("-n", lan, "link", "set", "br0", "up")
        for machine in machines:
            _ip("netns", "add", machine.netns)
            _ip("-n", machine.netns, "link", "add", "lan", "mtu", str(mtu), "type", "veth",
                "peer", "name", machine.name, "mtu", str(mtu), "netns", lan)
            _ip("-n", lan, "link", "set", "dev", machine.name, "master", "br0", "up")
            _ip("-n", machine.netns, "addr", "add", f"{machine.address}/24", "dev", "lan")
            _ip("-n", machine.netns, "link", "set", "dev", "lan", "up")
            _ip("-n", machine.netns, "link", "set", "dev", "lo", "up")
        yield machines
    finally:
        for netns in [*(m.netns for m in machines), lan]:
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
