"""The coordinator's TCP control port until a connection has proven the cluster's secret:
the one part of a run across machines that anyone on the cluster network can reach.

A stranger is held to small bounds: at most `pending_limit` connections are taken at once
(the rest wait in the kernel's backlog, unread), each has `proof_timeout_s` to answer the
challenge, its answer may be MAX_UNPROVEN_BYTES long (a longer one is refused from its
length alone), and anything else it says ends its connection, without a word in the log.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from testbed.common.codec import to_json
from testbed.emulator.runtime.coordinator.control_server import HELLO_TIMEOUT_S
from testbed.emulator.runtime.wire.join_messages import Challenge, Join, Refused
from testbed.emulator.runtime.wire.messages import receive_as, send
from testbed.emulator.runtime.wire.protocol import (
    MAX_UNPROVEN_BYTES,
    ProtocolError,
    frame,
    keep_alive,
)
from testbed.emulator.runtime.wire.secret import join_proof, proves

PENDING_LIMIT = 64
"""Connections taken at once that have not proven the secret yet. A run's own processes
prove it within a round trip, so they wait behind each other only briefly."""


@dataclass(frozen=True)
class Proven:
    """A connection whose process proved the secret on `challenge`, and its join."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    join: Join
    challenge: str


class JoinGate:
    """Takes connections on a listening socket and hands on those that prove the secret."""

    pending_limit = PENDING_LIMIT
    proof_timeout_s = HELLO_TIMEOUT_S

    def __init__(self, secret: bytes, admit: Callable[[Proven], Awaitable[None]],
                 is_open: Callable[[], bool]) -> None:
        self.secret = secret
        self.admit = admit
        """What becomes of a proven connection (it runs on the connection's own task)."""
        self.is_open = is_open
        """False once nobody else may join: a connection is closed as soon as taken."""
        self._accepting: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()

    def open(self, listener: socket.socket) -> None:
        """Take connections from `listener` (listening, non-blocking; the gate's now)."""
        self._accepting = asyncio.create_task(self._accept(listener))

    async def close(self) -> None:
        """Stop listening and end every connection's task (a proven one's too)."""
        tasks = [t for t in (self._accepting, *self._connections) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        slots = asyncio.Semaphore(self.pending_limit)
        with listener:
            while True:
                await slots.acquire()
                try:
                    conn, _ = await loop.sock_accept(listener)
                except OSError:  # out of file descriptors, say: the backlog waits a while
                    slots.release()
                    await asyncio.sleep(0.1)
                    continue
                task = asyncio.create_task(self._serve(conn, slots.release))
                self._connections.add(task)
                task.add_done_callback(self._connections.discard)

    async def _serve(self, conn: socket.socket, release: Callable[[], None]) -> None:
        try:
            proven = await self._prove(conn)
        finally:
            release()
        if proven is not None:
            await self.admit(proven)

    async def _prove(self, conn: socket.socket) -> Proven | None:
        """The connection's join once its proof holds; None once it has been dropped."""
        if not self.is_open():
            conn.close()
            return None
        try:
            keep_alive(conn)
            reader, writer = await asyncio.open_connection(sock=conn)
        except OSError:  # gone already
            conn.close()
            return None
        challenge = secrets.token_hex(16)
        try:
            async with asyncio.timeout(self.proof_timeout_s):
                await send(writer, Challenge(challenge))
                join = await receive_as(reader, Join, MAX_UNPROVEN_BYTES)
        except ProtocolError as exc:
            _refuse(writer, f"not a join: {exc}")
            return None
        except (TimeoutError, asyncio.IncompleteReadError, OSError):
            writer.close()
            return None
        except BaseException:
            writer.close()
            raise
        expected = join_proof(self.secret, challenge, join.nonce, join.machine,
                              join.local_rank)
        if not proves(expected, join.proof):
            _refuse(writer, "wrong secret (every machine needs the same secret file)")
            return None
        return Proven(reader, writer, join, challenge)


def _refuse(writer: asyncio.StreamWriter, reason: str) -> None:
    """Say why, without waiting for the peer to read it, and close."""
    writer.write(frame(to_json(Refused(reason))))
    writer.close()
