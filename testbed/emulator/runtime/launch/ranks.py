"""Who runs where, and with what environment: pure. A launch starts its command once per
GPU host (a rank each), or once per DC (`--per dc`: a node each, for torchrun's own
`--nproc-per-node`), in the order a placement gives: the topology file's, a policy's
(its plan's GPUs, replica by replica, stage by stage) or a file's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from testbed.emulator.net.layout import HOST_IF
from testbed.topology.model import Topology

Per = Literal["host", "dc"]
"""One process per GPU host, or one per DC (in its first host's namespace)."""
METRICS_PREFIX = "TESTBED_METRIC "
"""A line a program prints to report its own metrics: this prefix, then one JSON object."""
MASTER_PORT = 29500
"""torch's own default MASTER_PORT."""
RENDEZVOUS_PORT = 29400
"""torchrun's own default c10d rendezvous port."""
TRANSPORT_INTERFACES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "TP_SOCKET_IFNAME")
SHARED_RENDEZVOUS_STORE = "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"
"""torchrun's switch off its one store for every attempt: shared, a restarted group can read
the previous attempt's addresses (pytorch/pytorch#135712, #167288)."""


@dataclass(frozen=True)
class Seat:
    """One process a launch starts: a rank (per host) or a node (per DC)."""

    index: int
    """Its rank (per host) or node rank (per DC)."""
    host: str
    """The GPU host whose namespace it runs in."""
    dc: str
    gpus: tuple[str, ...]
    """The GPUs it stands for: its host's, or (per DC) its DC's."""
    local_rank: int
    """Its place among the seats of its DC."""
    local_world_size: int
    """Seats in its DC."""


def seats(order: Sequence[str], topology: Topology, per: Per) -> list[Seat]:
    """The launch's processes in rank order: `order` is the GPU hosts in rank order;
    per DC, each DC once, in the order its first host comes, with all its hosts' GPUs."""
    if per == "dc":
        dcs = list(dict.fromkeys(topology.dc_of(host) for host in order))
        return [Seat(i, f"{dc}-0", dc, tuple(h for h in order if topology.dc_of(h) == dc),
                     0, 1) for i, dc in enumerate(dcs)]
    dc_of = {host: topology.dc_of(host) for host in order}
    out = []
    for index, host in enumerate(order):
        same = [h for h in order if dc_of[h] == dc_of[host]]
        out.append(Seat(index, host, dc_of[host], (host,), same.index(host), len(same)))
    return out


@dataclass(frozen=True)
class Rendezvous:
    """Where the ranks meet: rank 0's address in the emulated network."""

    master_addr: str
    master_port: int = MASTER_PORT
    rendezvous_port: int = RENDEZVOUS_PORT
    run_id: str = "testbed"


def seat_env(seat: Seat, world: Sequence[Seat], meet: Rendezvous, per: Per,
             metrics_path: str) -> dict[str, str]:
    """The environment torch expects (and testbed's own) for one process. Per DC it is
    torchrun's: its arguments as PET_* variables (torchrun reads them as defaults), so
    `torchrun train.py` needs none of them on its command line."""
    common = {"MASTER_ADDR": meet.master_addr, "MASTER_PORT": str(meet.master_port),
              "TESTBED_DC": seat.dc, "TESTBED_GPU": ",".join(seat.gpus),
              "TESTBED_HOST": seat.host, "TESTBED_METRICS": metrics_path}
    if per == "dc":
        return {**common, "NODE_RANK": str(seat.index), "GROUP_RANK": str(seat.index),
                "NNODES": str(len(world)), "NPROC_PER_NODE": str(len(seat.gpus)),
                "PET_NNODES": str(len(world)), "PET_NODE_RANK": str(seat.index),
                "PET_NPROC_PER_NODE": str(len(seat.gpus)),
                "PET_MASTER_ADDR": meet.master_addr, "PET_MASTER_PORT": str(meet.master_port)}
    return {**common, "RANK": str(seat.index), "LOCAL_RANK": str(seat.local_rank),
            "WORLD_SIZE": str(len(world)), "LOCAL_WORLD_SIZE": str(seat.local_world_size),
            "GROUP_RANK": str(seat.index)}


def torchrun_argv(seat: Seat, world: Sequence[Seat], meet: Rendezvous, address: str,
                  max_restarts: int, python: str) -> list[str]:
    """`--torchrun`: torch's launcher for one host (or DC), its c10d rendezvous at rank
    0's host (which hosts the store); the command follows as it is (`--no-python`)."""
    args = [python, "-m", "torch.distributed.run", "--nnodes", str(len(world)),
            "--nproc-per-node", str(len(seat.gpus)), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"{meet.master_addr}:{meet.rendezvous_port}",
            "--rdzv-id", meet.run_id, "--local-addr", address,
            "--max-restarts", str(max_restarts)]
    # said, not guessed: torch's guess resolves this machine's host name
    args += ["--rdzv-conf", f"is_host={int(seat.index == 0)}"]
    return [*args, "--no-python"]


def observed_ranks(environments: Mapping[int, Mapping[str, str]]) -> list[int]:
    """The RANKs torch gave the processes it started under one torchrun (read from their
    environments), sorted."""
    return sorted({int(env["RANK"]) for env in environments.values()
                   if env.get("RANK", "").isdigit()})


def launch_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The launch's own environment (`environ`), with what torch's launcher also sets:
    one OpenMP thread per process unless the user chose, and unbuffered Python output
    (each line reaches the log and the console as the program prints it); and the
    interface a cluster's administrator names for torch's transports (gloo, NCCL,
    TensorPipe), the host's link to its router: they otherwise take the address this
    machine's host name resolves to, which no host namespace has. torchrun's workers meet
    in a store of their own attempt: in the store torchrun keeps for all attempts, a
    restarted worker that reads the store before its peer has written to it connects to
    the peer's previous, dead process and fails."""
    env = dict(environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault(SHARED_RENDEZVOUS_STORE, "1")
    for name in TRANSPORT_INTERFACES:
        env.setdefault(name, HOST_IF)
    return env
