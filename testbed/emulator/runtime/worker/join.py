"""A process torchrun started on one machine of a cluster: it joins the run's coordinator
over the cluster network and becomes the worker (or decode server) it is given.

Before any event loop or thread exists it checks the secret file's mode, connects (on
the machine's own network), answers the coordinator's challenge with an HMAC of the
cluster's secret, learns its seat from a coordinator that proves the secret in turn (on
this process's own nonce), measures its clock against the coordinator's (so every time
it reports is on one clock), then enters its host's namespace and runs the worker on the
connection it already has.

    torchrun ... -m testbed.emulator.runtime.worker.join
        --coordinator ADDR:PORT --secret FILE --machine M
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import sys
import time
from pathlib import Path

from testbed.common.codec import to_json
from testbed.emulator.net.enter import enter_netns, libc
from testbed.emulator.net.link_changes import change_link
from testbed.emulator.net.network import Network, bring_up, tear_down
from testbed.emulator.runtime.wire.join_messages import (
    Assign,
    Challenge,
    Join,
    LinkChange,
    Refused,
    ShareOrder,
    ShareUp,
    TimeAsk,
    TimeIs,
)
from testbed.emulator.runtime.wire.messages import (
    Message,
    WorkerError,
    decode,
    decode_as,
)
from testbed.emulator.runtime.wire.protocol import (
    MAX_UNPROVEN_BYTES,
    ProtocolError,
    frame,
    keep_alive,
    read_message_blocking,
)
from testbed.emulator.runtime.wire.secret import (
    coordinator_proof,
    join_proof,
    proves,
    run_token,
)
from testbed.emulator.runtime.worker.process import run_loop
from testbed.emulator.runtime.worker.share_events import LinkChanger
from testbed.emulator.runtime.worker.stopping import leave, until_signalled
from testbed.emulator.runtime.worker.transport import clock
from testbed.errors import TestbedError, one_line
from testbed.topology import parse_topology
from testbed.topology.cluster import parse_cluster
from testbed.topology.secret_file import read_secret_file

CONNECT_TIMEOUT_S = 30.0
CLOCK_SAMPLES = 8
class JoinFailed(Exception):
    pass


def die_with_parent() -> None:
    """A torchrun killed outright takes its processes with it (PR_SET_PDEATHSIG)."""
    libc().prctl(1, signal.SIGTERM)


def connect(address: str, port: int) -> socket.socket:
    """The control connection, retried while the coordinator is not listening yet."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        try:
            sock = socket.create_connection((address, port), timeout=10.0)
            break
        except OSError as exc:
            if time.monotonic() > deadline:
                raise JoinFailed(f"cannot reach the coordinator at {address}:{port}: "
                                 f"{exc.strerror or exc}") from None
            time.sleep(0.5)
    sock.settimeout(None)  # its seat may wait for the machine's share: the coordinator
    keep_alive(sock)  # bounds the wait (--join-timeout), liveness bounds a dead machine
    return sock


def tell(sock: socket.socket, message: Message) -> None:
    sock.sendall(frame(to_json(message)))


def clock_offset(sock: socket.socket) -> float:
    """How far this machine's monotonic clock is ahead of the coordinator's: the midpoint
    of the quickest of a few round trips (off by at most half that round trip)."""
    best: tuple[float, float] | None = None
    for _ in range(CLOCK_SAMPLES):
        before = time.monotonic()
        tell(sock, TimeAsk())
        theirs = decode_as(read_message_blocking(sock), TimeIs).now
        after = time.monotonic()
        if best is None or after - before < best[0]:
            best = (after - before, (before + after) / 2 - theirs)
    assert best is not None
    return best[1]


def join(sock: socket.socket, secret: bytes, machine: str, local_rank: int
         ) -> tuple[Assign, Network | None]:
    """Seat given by a coordinator that proved the secret, the machine's share of the
    network up (the first process's task), clock measured, host's namespace entered."""
    answer = seat_from(sock, secret, machine, local_rank)
    network = None if answer.share is None else share_up(sock, answer.share, machine)
    if answer.role == "network":
        return answer, network
    try:
        clock.set_offset(clock_offset(sock))
        enter_netns(answer.netns)
    except BaseException as exc:
        if network is not None:
            tear_down(network)
        if isinstance(exc, FileNotFoundError):
            raise JoinFailed(f"machine {machine} has no namespace {answer.netns} for "
                             f"{answer.host}") from None
        raise
    return answer, network


def seat_from(sock: socket.socket, secret: bytes, machine: str, local_rank: int) -> Assign:
    """Each side proves the secret on the other's fresh nonce; nothing the coordinator
    says is acted on before its proof holds. JoinFailed names the coordinator otherwise."""
    host, port = sock.getpeername()[:2]
    coordinator = f"the coordinator at {host}:{port}"
    nonce = secrets.token_hex(16)
    try:
        challenge = decode_as(read_message_blocking(sock, MAX_UNPROVEN_BYTES), Challenge).nonce
        tell(sock, Join(machine, local_rank, os.getpid(), nonce,
                        join_proof(secret, challenge, nonce, machine, local_rank)))
        answer = decode(read_message_blocking(sock), Assign, Refused)
    except ProtocolError as exc:
        raise JoinFailed(f"{coordinator}: {exc}") from None
    except ConnectionError:  # reset or closed: either way it turned us away
        raise JoinFailed(f"{coordinator} closed the connection") from None
    if isinstance(answer, Refused):
        raise JoinFailed(f"{coordinator} refused machine {machine} rank {local_rank}: "
                         f"{one_line(answer.reason)[:200]}")
    assert isinstance(answer, Assign)
    expected = coordinator_proof(secret, challenge, nonce, machine, local_rank, answer.nonce)
    if not proves(expected, answer.proof):
        raise JoinFailed(f"{coordinator} did not prove the cluster's secret: another "
                         "process listens there, or it holds another secret")
    return answer


def share_up(sock: socket.socket, order: ShareOrder, machine: str) -> Network:
    """Bring up this machine's share of the run's network and say so (or why not)."""
    started = time.monotonic()
    try:
        topology = parse_topology(json.loads(order.topology), "the run's topology")
        cluster = parse_cluster(json.loads(order.cluster), "the run's cluster", topology)
        network = bring_up(topology, order.shaper, say, False, order.seed,
                           tuple(order.decode_dcs), cluster, machine)
    except (TestbedError, OSError) as exc:
        problem = f"machine {machine}: its share of the network could not be made: {exc}"
        tell(sock, WorkerError(problem, -1, []))
        raise JoinFailed(problem) from None
    tell(sock, ShareUp(time.monotonic() - started))
    return network


def hold(sock: socket.socket, network: Network | None) -> int:
    """Keep this machine's share of the network up, applying network events to it, until
    the coordinator ends the run (closes the connection) or a signal ends this process."""
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda number, _frame: sys.exit(128 + number))
    links = link_changer(network)
    with contextlib.suppress(OSError):
        while links is not None:
            change = decode_as(read_message_blocking(sock), LinkChange)
            try:
                links(change)
            except Exception as exc:
                tell(sock, WorkerError(f"network event on {change.a}-{change.b} could not "
                                       f"be applied on this machine: {exc}", -1, []))
    return 0


def link_changer(network: Network | None) -> LinkChanger | None:
    """How this process applies network events: to the share it holds, if it holds one."""
    if network is None:
        return None
    return lambda c: change_link(network, c.a, c.b, c.latency_s, c.bandwidth_bps, c.loss,
                                 c.one_way)


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def become(sock: socket.socket, seat: Assign, token: str,
                 links: LinkChanger | None) -> int | None:
    """Run as the seat's worker or decode server on the joined connection."""
    reader, writer = await asyncio.open_connection(sock=sock)
    if seat.role == "decode":
        from testbed.emulator.runtime.worker.decode import DECODE_PORT, serve_on

        await serve_on(reader, writer, seat.host, token, seat.address, DECODE_PORT, links)
        return 0
    from testbed.emulator.runtime.worker.process import serve_on as serve_worker

    return await serve_worker(reader, writer, seat.host, token, links)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description="join a testbed run from a machine of its cluster (started by torchrun)")
    parser.add_argument("--coordinator", required=True, metavar="ADDRESS:PORT",
                        help="the coordinator's control channel on the cluster network")
    parser.add_argument("--secret", required=True, type=Path,
                        help="the cluster's secret file (the cluster file's `secret`)")
    parser.add_argument("--machine", required=True, help="this machine's name in the cluster")
    args = parser.parse_args(argv)
    die_with_parent()
    rank = os.environ.get("LOCAL_RANK")
    name = f"testbed join ({args.machine}, rank {rank})"
    if rank is None or not rank.isdigit():
        sys.exit(f"{name}: LOCAL_RANK is not set: start this with torchrun")
    address, _, port = args.coordinator.rpartition(":")
    try:
        secret = read_secret_file(args.secret)
        sock = connect(address, int(port))
        seat, network = join(sock, secret, args.machine, int(rank))
    except (OSError, JoinFailed, ProtocolError, ValueError, TestbedError) as exc:
        sys.exit(f"{name}: {exc}")
    try:
        if seat.role == "network":
            code = hold(sock, network)
        else:
            code = run_loop(until_signalled(become(
                sock, seat, run_token(secret, seat.nonce), link_changer(network))))
    except (asyncio.CancelledError, KeyboardInterrupt):
        code = 1
    except Exception as exc:
        say(f"{seat.role} {seat.host}: {type(exc).__name__}: {exc}")
        code = 1
    finally:
        if network is not None:
            for problem in tear_down(network):
                say(f"teardown: {problem}")
    leave(code or 0)


if __name__ == "__main__":
    main()
