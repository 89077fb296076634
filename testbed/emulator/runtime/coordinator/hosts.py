"""Where a run's processes live: the emulated network's host namespaces, or (in tests)
anything else that can start a process and name an address.

The coordinator only talks to `Hosts`, so its control logic runs without root when a
test hands it hosts that are plain local processes.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TextIO

from testbed.common.owners import process_start_ticks
from testbed.emulator.net.layout import Layout, Node, build_layout
from testbed.emulator.net.link_changes import change_link
from testbed.emulator.net.network import Network, bring_up, tear_down
from testbed.emulator.net.network import Progress as Say
from testbed.emulator.net.state import ProcessRecord
from testbed.emulator.net.tcp_state import SocketState, socket_states
from testbed.emulator.runtime.coordinator.exits import exit_reason
from testbed.emulator.runtime.coordinator.health import delay_line_lateness
from testbed.topology.cluster import Cluster
from testbed.topology.model import Topology


@dataclass(frozen=True)
class WanSocket:
    """A socket of one host's connection to a host of another DC, by the hosts' names."""

    host: str
    peer: str
    state: SocketState


def wan_sockets(states: dict[str, list[SocketState]], hosts: dict[str, tuple[str, str]]
                ) -> list[WanSocket]:
    """Of each host's sockets (`states`, by host name), those to a host of another DC that
    sent data, by host and peer; `hosts`: each address's host and DC."""
    dc_of = dict(hosts.values())
    out = []
    for host, sockets in states.items():
        dc = dc_of.get(host)
        for state in sockets:
            peer = hosts.get(state.peer)
            if peer is not None and peer[1] != dc and state.bytes_sent > 0:
                out.append(WanSocket(host, peer[0], state))
    return sorted(out, key=lambda s: (s.host, s.peer, s.state.local))


class Hosts(Protocol):
    """What a run needs from the machines its workers run on."""

    def bring_up(self, topology: Topology, decode_dcs: tuple[str, ...]) -> None:
        """Create the hosts (blocking; the caller runs it in a thread and lets it finish
        even when cancelled, so that `tear_down` knows what exists)."""

    def control_dir(self) -> Path:
        """A private directory for the run's control socket."""

    def address_of(self, host: str) -> str:
        """The address `host` listens on for data connections."""

    async def spawn(self, host: str, module: str, args: list[str], env: Mapping[str, str],
                    log: TextIO, name: str) -> asyncio.subprocess.Process:
        """Start `python -m module args` as `host`, output to `log`."""

    async def launch(self, argv: list[str], netns: str | None, env: Mapping[str, str],
                     log: TextIO, name: str) -> asyncio.subprocess.Process:
        """Start `argv` on this machine's own network (`netns`: the namespace that holds
        it, if one does), output to `log`."""

    def change_link(self, a: str, b: str, latency_s: float | None,
                    bandwidth_bps: float | None, loss: float | None,
                    one_way: bool = False) -> None:
        """Apply a network event to the WAN link between DCs `a` and `b` (only the
        direction a->b when `one_way`)."""

    def broken(self) -> str | None:
        """Why the emulated network no longer works, if it does not."""

    def lateness(self) -> tuple[float, float] | None:
        """How late the delay lines released packets (mean, max seconds), if measured."""

    def wan_sockets(self) -> list[WanSocket]:
        """The hosts' TCP sockets to hosts of other DCs as their kernels hold them now
        (testbed.emulator.net.tcp_state); none where there is no emulated network."""

    def shaper(self) -> str | None:
        """The shaper in use, once up."""

    def tear_down(self) -> list[str]:
        """Remove everything `bring_up` made; what could not be removed."""


class NamespaceHosts:
    """Hosts in network namespaces behind the shaped links of an emulated WAN."""

    def __init__(self, shaper: str, say: Say, seed: int, cluster: Cluster | None = None,
                 machine: str | None = None) -> None:
        self.requested_shaper = shaper
        self.say = say
        self.seed = seed
        self.cluster = cluster
        """With a cluster: only `machine`'s share of the network is made here."""
        self.machine = machine
        self.network: Network | None = None
        self.whole: Layout | None = None
        """With a cluster: the whole network's layout (this machine made its share)."""

    def bring_up(self, topology: Topology, decode_dcs: tuple[str, ...]) -> None:
        if self.cluster is not None:
            self.whole = build_layout(topology, self.cluster.slot, decode_dcs)
        self.network = bring_up(topology, self.requested_shaper, self.say, False, self.seed,
                                decode_dcs, self.cluster, self.machine)

    def _up(self) -> Network:
        if self.network is None:
            raise RuntimeError("the network is not up")
        return self.network

    def control_dir(self) -> Path:
        path = self._up().state.path.with_suffix("")
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        return path

    def _node(self, host: str) -> Node:
        return (self.whole or self._up().layout).node(host)

    def address_of(self, host: str) -> str:
        return self._node(host).address

    def netns_of(self, host: str) -> str:
        return self._node(host).netns

    def dc_of(self, host: str) -> str:
        return self._node(host).dc

    async def spawn(self, host: str, module: str, args: list[str], env: Mapping[str, str],
                    log: TextIO, name: str) -> asyncio.subprocess.Process:
        return await self.launch([sys.executable, "-m", module, *args],
                                 self._up().netns_of(host), env, log, name)

    async def launch(self, argv: list[str], netns: str | None, env: Mapping[str, str],
                     log: TextIO, name: str) -> asyncio.subprocess.Process:
        """Start `argv` in namespace `netns` (None: this machine's own network), recorded
        in the run's state so that `testbed down` finds it if this run is killed."""
        network = self._up()
        inside = ["ip", "netns", "exec", netns] if netns else []
        process = await asyncio.create_subprocess_exec(
            *inside, *argv, env=dict(env), stdin=asyncio.subprocess.DEVNULL, stdout=log,
            stderr=log)
        pid = process.pid
        network.state.processes.append(ProcessRecord(pid, process_start_ticks(pid) or 0, name))
        network.state.save()  # `testbed down` finds it if this run is killed
        return process

    def change_link(self, a: str, b: str, latency_s: float | None,
                    bandwidth_bps: float | None, loss: float | None,
                    one_way: bool = False) -> None:
        change_link(self._up(), a, b, latency_s, bandwidth_bps, loss, one_way)

    def broken(self) -> str | None:
        if self.network is None:
            return None
        for key, proc in self.network.delay_lines.items():
            code = proc.poll()
            if code is not None:
                return (f"the delay line for WAN link {key} {exit_reason(code)}: the "
                        f"emulated network is broken")
        return None

    def lateness(self) -> tuple[float, float] | None:
        return delay_line_lateness(self._up().delay_line_stats())

    def wan_sockets(self) -> list[WanSocket]:
        here = self._up().layout.nodes
        hosts = {n.address: (n.name, n.dc) for n in (self.whole or self._up().layout).nodes}
        return wan_sockets({n.name: socket_states(n.netns) for n in here}, hosts)

    def shaper(self) -> str | None:
        return self.network.shaper.value if self.network else None

    def tear_down(self) -> list[str]:
        return tear_down(self.network) if self.network is not None else []
