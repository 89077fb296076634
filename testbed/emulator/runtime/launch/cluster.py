"""`testbed launch` across machines: every machine runs the same command and starts the
ranks of its own DCs; this keeps them together at both ends. The coordinator (the cluster
file's) takes each other machine's connection on its control port once it has proven the
cluster's secret (testbed.emulator.runtime.coordinator.join_gate), after that machine's share of
the network is up; when every machine is there it answers each with its own proof, and
that answer is everyone's start. At the end, each machine keeps its share up until the
coordinator closes the connection, which it does once every machine's ranks have ended:
a machine whose own ranks are done may still carry another's bytes (a tunnel, a router),
and a namespace removed under a socket loses what it had not sent. A coordinator that
stops (Ctrl-C, killed, cut off) closes the connections, and the others stop their ranks."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from testbed.emulator.net.enter import enter_netns, listening_socket
from testbed.emulator.runtime.coordinator.join_gate import JoinGate, Proven
from testbed.emulator.runtime.wire.join_messages import Assign, LaunchEnded, Refused
from testbed.emulator.runtime.wire.messages import receive_as, send
from testbed.emulator.runtime.wire.protocol import ProtocolError
from testbed.emulator.runtime.wire.secret import coordinator_proof
from testbed.topology.cluster import Cluster

JOIN_TIMEOUT_S = 300.0


@dataclass
class Coordinator:
    """The coordinator's side: every other machine, joined, started, let go."""

    cluster: Cluster
    machine: str
    secret: bytes
    say: Callable[[str], None]
    joined: dict[str, Proven] = field(default_factory=dict)
    ended: dict[str, str] = field(default_factory=dict)
    _all: asyncio.Event = field(default_factory=asyncio.Event)
    _gate: JoinGate | None = None
    _nonce: str = field(default_factory=lambda: secrets.token_hex(16))

    @property
    def others(self) -> list[str]:
        return [m.name for m in self.cluster.machines if m.name != self.machine]

    async def gather(self, timeout_s: float = JOIN_TIMEOUT_S) -> None:
        """Every other machine joined (its share up), or TimeoutError naming those not."""
        here = self.cluster.machine(self.machine)
        self._gate = JoinGate(self.secret, self._admit, lambda: not self._all.is_set())
        self._gate.open(listening_socket(here.netns, here.address, self.cluster.control_port))
        if self.others:
            self.say(f"waiting for {', '.join(self.others)} to run the same command "
                     f"(within {timeout_s:g} s)")
        try:
            await asyncio.wait_for(self._all.wait(), timeout_s if self.others else 0.1)
        except TimeoutError:
            missing = [m for m in self.others if m not in self.joined]
            if missing:
                raise TimeoutError(f"machines {', '.join(missing)} did not join within "
                                   f"{timeout_s:g} s") from None

    async def _admit(self, proven: Proven) -> None:
        name = proven.join.machine
        if name not in self.others or name in self.joined:
            with contextlib.suppress(ConnectionError):
                await send(proven.writer, Refused(f"machine {name} is not another machine "
                                                  "of this launch, or has joined already"))
            proven.writer.close()
            return
        self.joined[name] = proven
        self.say(f"machine {name} joined (its share of the network is up)")
        if set(self.joined) == set(self.others):
            self._all.set()

    async def start(self) -> None:
        """Everyone's start: each machine answered with the coordinator's proof."""
        for name, proven in self.joined.items():
            join = proven.join
            proof = coordinator_proof(self.secret, proven.challenge, join.nonce, name,
                                      join.local_rank, self._nonce)
            await send(proven.writer, Assign("", "", "launch", "", self._nonce, proof))

    async def finish(self) -> dict[str, str]:
        """Once this machine's ranks have ended: each other machine's end (its status, or
        how its connection ended), then every connection closed (the shares may go)."""
        async def one(name: str, proven: Proven) -> None:
            try:
                ended = await receive_as(proven.reader, LaunchEnded)
                self.ended[name] = ended.status
            except (asyncio.IncompleteReadError, ConnectionError, ProtocolError, OSError):
                self.ended[name] = "lost its connection"

        await asyncio.gather(*(one(n, p) for n, p in self.joined.items()))
        await self.close()
        return dict(self.ended)

    async def close(self) -> None:
        for proven in self.joined.values():
            proven.writer.close()
        if self._gate is not None:
            await self._gate.close()


@dataclass
class Follower:
    """Another machine's side: joined to the coordinator, started by it, held by it."""

    cluster: Cluster
    machine: str
    secret: bytes
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None

    async def join(self) -> None:
        """Connect (retrying while the coordinator is not listening yet), prove the
        secret, and wait for the start: the coordinator's answer, with its proof."""
        from testbed.emulator.runtime.worker.join import connect, seat_from

        coordinator = self.cluster.machine(self.cluster.coordinator)
        netns = self.cluster.machine(self.machine).netns

        def blocking() -> socket.socket:
            if netns is not None:  # this thread alone: setns moves the calling thread
                enter_netns(netns)
            sock = connect(coordinator.address, self.cluster.control_port)
            try:
                seat_from(sock, self.secret, self.machine, 0)
            except BaseException:
                sock.close()
                raise
            return sock

        # a thread of its own, ended after: one that entered a namespace serves no other
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="launch-join") as one:
            sock = await asyncio.get_running_loop().run_in_executor(one, blocking)
        self.reader, self.writer = await asyncio.open_connection(sock=sock)

    async def gone(self) -> None:
        """Returns when the coordinator closes the connection (or it is lost)."""
        assert self.reader is not None
        with contextlib.suppress(OSError):
            await self.reader.read()

    async def ended(self, status: str) -> None:
        """This machine's ranks have ended: say so, and hold the share until let go."""
        assert self.writer is not None
        with contextlib.suppress(OSError):
            await send(self.writer, LaunchEnded(status))
        await self.gone()
