"""Who runs where in a run across machines, and the torchrun command each machine runs.

Pure: from the cluster file and the run's processes (workers by GPU host, decode servers
by name) it decides each machine's seats, in local-rank order, and the command line that
starts them there with torch's own launcher (c10d rendezvous at the first machine with
seats, which hosts the rendezvous store). Each process torchrun starts runs
`testbed.emulator.runtime.worker.join`: it joins the coordinator and becomes its seat's worker.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

from testbed.topology.cluster import Cluster, Machine

Role = Literal["worker", "decode", "network"]
"""A seat's job; "network": hold the machine's share of the network while the run lasts
(a machine that carries DCs no process of the plan runs on)."""
JOIN_MODULE = "testbed.emulator.runtime.worker.join"


@dataclass(frozen=True)
class ClusterRun:
    """What a run across machines adds to a run: the cluster, which machine this is."""

    cluster: Cluster
    machine: str
    """This machine: the cluster's coordinator."""
    secret: bytes
    """What the cluster file's `secret` file holds (testbed.emulator.runtime.wire.secret)."""
    join_timeout_s: float = 300.0
    """How long the other machines get to start their torchrun."""

    @property
    def secret_path(self) -> Path:
        """The secret's file, as every machine's command names it."""
        if self.cluster.secret is None:
            raise ValueError("a run across machines needs the cluster file's `secret`")
        return self.cluster.secret


@dataclass(frozen=True)
class Seat:
    host: str
    role: Role


@dataclass(frozen=True)
class MachineSeats:
    machine: Machine
    seats: tuple[Seat, ...]
    """Local rank i of the machine's torchrun takes seats[i]."""


def machine_seats(cluster: Cluster, dc_of: Callable[[str], str], workers: list[str],
                  decoders: list[str]) -> list[MachineSeats]:
    """The machines that run processes, the coordinator's first, each with its seats:
    its DCs' workers in the order given, then its decode servers. Every other machine
    runs at least the process that holds its share of the network, so the whole network
    exists (a path may cross DCs the plan does not use); the coordinator holds its own."""
    seats: dict[str, list[Seat]] = {m.name: [] for m in cluster.machines}
    roles: list[tuple[Role, list[str]]] = [("worker", workers), ("decode", decoders)]
    for role, hosts in roles:
        for host in hosts:
            seats[cluster.machine_of(dc_of(host)).name].append(Seat(host, role))
    for machine in cluster.machines:
        if not seats[machine.name] and machine.name != cluster.coordinator:
            seats[machine.name].append(Seat(f"{machine.name}-network", "network"))
    order = sorted(cluster.machines, key=lambda m: m.name != cluster.coordinator)
    return [MachineSeats(m, tuple(seats[m.name])) for m in order if seats[m.name]]


def torchrun_args(cluster: Cluster, everyone: list[MachineSeats], one: MachineSeats,
                  run_id: str, secret: Path) -> list[str]:
    """torchrun's arguments on machine `one` (the program's name not included)."""
    store = everyone[0].machine
    coordinator = cluster.machine(cluster.coordinator)
    args = ["--nnodes", str(len(everyone)), "--nproc-per-node", str(len(one.seats)),
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{store.address}:{cluster.rendezvous_port}",
            "--rdzv-id", run_id, "--local-addr", one.machine.address, "--max-restarts", "0"]
    if one.machine == store:  # its address may not be one torch recognises as its own
        args += ["--rdzv-conf", "is_host=1"]
    return [*args, "-m", JOIN_MODULE,
            "--coordinator", f"{coordinator.address}:{cluster.control_port}",
            "--secret", str(secret), "--machine", one.machine.name]


def command_line(cluster: Cluster, everyone: list[MachineSeats], one: MachineSeats,
                 run_id: str, secret: Path) -> str:
    """What to type on machine `one` (in its namespace when the cluster file names one)."""
    inside = ["ip", "netns", "exec", one.machine.netns] if one.machine.netns else []
    return shlex.join([*inside, "torchrun",
                       *torchrun_args(cluster, everyone, one, run_id, secret)])


class MachineRecord(TypedDict):
    name: str
    address: str
    dcs: list[str]


class ClusterRecord(TypedDict):
    """A run across several machines as results.json records it."""

    name: str
    coordinator: str
    machines: list[MachineRecord]


def describe_run(run: ClusterRun) -> ClusterRecord:
    """The cluster as results.json records it."""
    cluster = run.cluster
    return {"name": cluster.name, "coordinator": run.machine,
            "machines": [{"name": m.name, "address": m.address, "dcs": list(m.dcs)}
                         for m in cluster.machines]}
