"""A run across machines, coordinator side: the control channel on the cluster network
(who may join, which seat each joining process takes, its clock), the torchrun this
machine starts for its own seats, and the commands printed for the others.

Every process joins over TCP (testbed.emulator.runtime.worker.join): past the gate
(testbed.emulator.runtime.coordinator.join_gate) it has proven the cluster's secret on a
fresh nonce; it is told its seat and the run's nonce (its token follows from the secret)
with the coordinator's own proof on its nonce, asks the time a few times, enters its
host's namespace and says hello there; from then on it is an ordinary worker of
ControlServer's handshake.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable

from testbed.emulator.net.enter import listening_socket
from testbed.emulator.runtime.coordinator.control_server import ControlServer
from testbed.emulator.runtime.coordinator.hosts import NamespaceHosts
from testbed.emulator.runtime.coordinator.join_gate import JoinGate, Proven
from testbed.emulator.runtime.coordinator.pool import WorkerPool
from testbed.emulator.runtime.wire.join_messages import (
    Assign,
    Join,
    LinkChange,
    Refused,
    ShareOrder,
    ShareUp,
    TimeAsk,
    TimeIs,
)
from testbed.emulator.runtime.wire.messages import (
    Hello,
    WorkerError,
    receive,
    send,
)
from testbed.emulator.runtime.wire.protocol import ProtocolError
from testbed.emulator.runtime.wire.secret import coordinator_proof
from testbed.topology.cluster import dump_cluster
from testbed.topology.load import dump_topology
from testbed.topology.model import Topology
from testbed.topology.seats import (
    ClusterRun,
    MachineSeats,
    Seat,
    command_line,
    machine_seats,
    torchrun_args,
)

JOIN_STEP_TIMEOUT_S = 60.0
"""How long a joined process may take between its clock questions and its hello."""


class ClusterJoins:
    """The TCP side of the control channel: turns joining processes into hellos."""

    def __init__(self, control: ControlServer, run: ClusterRun, nonce: str,
                 seats: list[MachineSeats], netns_of: Callable[[str], str],
                 address_of: Callable[[str], str], fail: Callable[[str], None],
                 share: ShareOrder, say: Callable[[str], None]) -> None:
        self.control = control
        self.share = share
        self.say = say
        self.shares_up = {m.machine.name: asyncio.Event() for m in seats}
        """Set once the machine's share of the network is up (this machine's already is)."""
        self.shares_up.setdefault(run.machine, asyncio.Event()).set()
        self.run = run
        self.nonce = nonce
        self.seats: dict[tuple[str, int], Seat] = {
            (m.machine.name, rank): seat for m in seats for rank, seat in enumerate(m.seats)}
        self.netns_of = netns_of
        self.address_of = address_of
        self.fail = fail
        self.joined: set[tuple[str, int]] = set()
        self.gate = JoinGate(run.secret, self.on_join, lambda: not control.closed_to_newcomers)
        self._share_holders: dict[str, asyncio.StreamWriter] = {}
        """Each other machine's first process, which holds its share: network events go
        to it, and closing its connection ends the run there."""
        self._closing = False

    async def listen(self) -> None:
        cluster = self.run.cluster
        here = cluster.machine(self.run.machine)
        self.gate.open(listening_socket(here.netns, here.address, cluster.control_port))

    async def close(self) -> None:
        self._closing = True
        await self.gate.close()
        for writer in self._share_holders.values():  # the run is over: shares may go
            writer.close()

    async def change_link(self, a: str, b: str, latency_s: float | None,
                          bandwidth_bps: float | None, loss: float | None,
                          one_way: bool = False) -> None:
        """A network event on link a-b, to the other machines whose routers send on it."""
        cluster = self.run.cluster
        for machine in dict.fromkeys(cluster.machine_of(dc).name for dc in (a, b)):
            writer = self._share_holders.get(machine)
            if writer is not None:
                await send(writer, LinkChange(a, b, latency_s, bandwidth_bps, loss, one_way))

    async def shares_ready(self) -> None:
        """Every machine's share of the network is up."""
        for event in self.shares_up.values():
            await event.wait()

    async def _hold(self, reader: asyncio.StreamReader, machine: str) -> None:
        """A process that only holds its machine's share: the run fails if it leaves."""
        with contextlib.suppress(OSError):
            await reader.read()
        if not self._closing:
            self.fail(f"machine {machine}, which holds its share of the network, left the "
                      "run (its torchrun ended or its connection was lost)")

    def missing(self) -> str:
        """Machines whose processes have not all joined, with how many are missing."""
        absent: dict[str, int] = {}
        for key in self.seats:
            if key not in self.joined:
                absent[key[0]] = absent.get(key[0], 0) + 1
        return ", ".join(f"{name} ({count} of {sum(k[0] == name for k in self.seats)})"
                         for name, count in absent.items())

    async def on_join(self, proven: Proven) -> None:
        """A process that proved the secret: its seat, with the coordinator's proof."""
        reader, writer, join = proven.reader, proven.writer, proven.join
        seat, reason = self._seat(join)
        if seat is None:
            with contextlib.suppress(ConnectionError):
                await send(writer, Refused(reason))
            writer.close()
            return
        first = join.local_rank == 0 and join.machine != self.run.machine
        if not first:  # the machine's first process brings up its share: wait for it
            await self.shares_up[join.machine].wait()
        proof = coordinator_proof(self.run.secret, proven.challenge, join.nonce, join.machine,
                                  join.local_rank, self.nonce)
        if seat.role == "network":
            assign = Assign(seat.host, "", seat.role, "", self.nonce, proof, self.share)
        else:
            assign = Assign(seat.host, self.netns_of(seat.host), seat.role,
                            self.address_of(seat.host), self.nonce, proof,
                            self.share if first else None)
        if assign.share is not None:
            self._share_holders[join.machine] = writer
        await self._until_hello(reader, writer, join, seat, assign)

    def _seat(self, join: Join) -> tuple[Seat | None, str]:
        key = (join.machine, join.local_rank)
        seat = self.seats.get(key)
        if seat is None:
            ranks = sum(k[0] == join.machine for k in self.seats)
            return None, (f"machine {join.machine} has {ranks} processes in this run, not "
                          f"rank {join.local_rank}")
        if key in self.joined:
            return None, f"machine {join.machine} rank {join.local_rank} already joined"
        self.joined.add(key)
        return seat, ""

    async def _until_hello(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                           join: Join, seat: Seat, assign: Assign) -> None:
        """Give the seat, then answer clock questions until the process says hello from
        its host."""
        answer: Assign | TimeIs | None = assign
        while True:
            try:
                if answer is not None:
                    await send(writer, answer)
                message = await asyncio.wait_for(
                    receive(reader, TimeAsk, ShareUp, Hello, WorkerError), JOIN_STEP_TIMEOUT_S)
            except (TimeoutError, asyncio.IncompleteReadError, ProtocolError,
                    ConnectionError):
                writer.close()
                self.fail(f"{seat.host} on machine {join.machine} left while joining")
                return
            answer = None
            match message:
                case TimeAsk():
                    answer = TimeIs(time.monotonic())
                case ShareUp(seconds=seconds):
                    self.say(f"machine {join.machine}: its share of the network is up "
                             f"({seconds:.1f} s)")
                    self.shares_up[join.machine].set()
                    if seat.role == "network":
                        await self._hold(reader, join.machine)
                        return
                case Hello():
                    await self.control.hellos.put((reader, writer, message))
                    return
                case WorkerError():
                    writer.close()
                    self.fail(message.message)
                    return


def share_order(topology: Topology, decode_dcs: tuple[str, ...], run: ClusterRun,
                shaper: str, seed: int) -> ShareOrder:
    """What every other machine brings up: this run's network as emulated."""
    return ShareOrder(json.dumps(dump_topology(topology)), json.dumps(dump_cluster(run.cluster)),
                      list(decode_dcs), shaper, seed)


def local_command(run: ClusterRun, everyone: list[MachineSeats], run_id: str
                  ) -> list[str] | None:
    """The torchrun this machine starts for its own seats (as `python -m`), if it has any."""
    for one in everyone:
        if one.machine.name == run.machine:
            return [sys.executable, "-m", "torch.distributed.run",
                    *torchrun_args(run.cluster, everyone, one, run_id, run.secret_path)]
    return None


def remote_commands(run: ClusterRun, everyone: list[MachineSeats], run_id: str
                    ) -> list[tuple[str, str]]:
    """(machine, command line) for each other machine with seats."""
    return [(one.machine.name, command_line(run.cluster, everyone, one, run_id,
                                           run.secret_path))
            for one in everyone if one.machine.name != run.machine]


async def start_across_machines(run: ClusterRun, pool: WorkerPool, control: ControlServer,
                                hosts: NamespaceHosts, share: ShareOrder, nonce: str,
                                say: Callable[[str], None], fail: Callable[[str], None]
                                ) -> ClusterJoins:
    """Seats decided, the control channel open on the cluster network, this machine's
    torchrun started and every other machine's command printed."""
    everyone = machine_seats(run.cluster, hosts.dc_of, [w.gpu for w in pool.workers],
                             [d.gpu for d in pool.decoders])
    on = {seat.host: m.machine.name for m in everyone for seat in m.seats}
    for handle in [*pool.workers, *pool.decoders]:
        handle.machine = on[handle.gpu]
    joins = ClusterJoins(control, run, nonce, everyone, hosts.netns_of, hosts.address_of, fail,
                         share, say)
    await joins.listen()
    run_id = f"testbed-{nonce[:12]}"
    others = remote_commands(run, everyone, run_id)
    if others:
        say(f"start the workers on the other machines within {run.join_timeout_s:g} s "
            "(each brings up its share of the network):")
        for machine, line in others:
            say(f"  on {machine}: {line}")
    local = local_command(run, everyone, run_id)
    if local is not None:
        await pool.launch(run.machine, local, run.cluster.machine(run.machine).netns)
    return joins
