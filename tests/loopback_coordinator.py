"""The coordinator's side of a run across machines on loopback, without root: the real
ClusterJoins (gate included) on its own event loop in a thread, for a test to join, or
to attack, over real TCP from its own thread."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.emulator.runtime.coordinator.cluster_run import ClusterJoins
from testbed.emulator.runtime.coordinator.control_server import ControlServer
from testbed.emulator.runtime.coordinator.join_gate import JoinGate
from testbed.emulator.runtime.wire.join_messages import ShareOrder
from testbed.topology import load_topology
from testbed.topology.cluster import parse_cluster
from testbed.topology.seats import ClusterRun, machine_seats

ROOT = Path(__file__).resolve().parent.parent
PAPER = load_topology(ROOT / "topologies" / "paper-3dc.yaml")
SECRET = b"0123456789abcdef0123456789abcdef"
RUN_NONCE = "nonce"


def cluster_data(**extra: Any) -> dict[str, Any]:
    """m1 (the coordinator) on loopback; m2 and m3 elsewhere."""
    return {"machines": [
        {"name": "m1", "address": "127.0.0.1", "dcs": ["east"]},
        {"name": "m2", "address": "10.251.0.2", "dcs": ["central"], "netns": "tbcl-m2"},
        {"name": "m3", "address": "10.251.0.3", "dcs": ["west"]},
    ], **extra}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Listening:
    port: int
    failures: list[str] = field(default_factory=list)
    """What the run was failed with, in order."""


@contextmanager
def loopback_coordinator(pending_limit: int = JoinGate.pending_limit,
                         proof_timeout_s: float = JoinGate.proof_timeout_s
                         ) -> Iterator[Listening]:
    """The coordinator listening on 127.0.0.1 with seats east-0 (m1, rank 0: its host's
    namespace does not exist) and central-0 (m2, rank 0: its share order is empty)."""
    port = free_port()
    cluster = parse_cluster(cluster_data(control_port=port), "c.yaml", PAPER)
    run = ClusterRun(cluster, "m1", SECRET)
    seats = machine_seats(cluster, PAPER.dc_of, ["east-0", "central-0"], [])
    listening = Listening(port)
    ready = threading.Event()
    stop: asyncio.Event | None = None

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        joins = ClusterJoins(ControlServer("token"), run, RUN_NONCE, seats,
                             lambda host: f"no-such-namespace-{host}", lambda _h: "10.0.0.1",
                             listening.failures.append, ShareOrder("{}", "{}", [], "auto", 0),
                             lambda _m: None)
        joins.gate.pending_limit = pending_limit
        joins.gate.proof_timeout_s = proof_timeout_s
        await joins.listen()
        ready.set()
        await stop.wait()
        await joins.close()

    loop = asyncio.new_event_loop()
    server = threading.Thread(target=loop.run_until_complete, args=(serve(),))
    server.start()
    assert ready.wait(10), "the coordinator did not start listening"
    try:
        yield listening
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        server.join(10)
        loop.close()
