"""Tensors between workers over N TCP connections per peer, each message striped across them.

One TCP flow on a long link is capped at window/RTT; striping a tensor over N connections
raises that N-fold until the link is full. Every connection starts with the run's secret,
so only this run's workers get in. Messages are matched by tag, so sender and receiver
need not agree on order.

Receiving goes straight into the destination buffer (asyncio.BufferedProtocol): the socket
is read whenever data is there, never paused, so the receive window stays open. A
transport that keeps sizes, not payloads (emulated compute, where nobody reads them)
reads every payload into one small scratch buffer and hands over only its size, so its
memory does not grow with the messages in flight.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from testbed.emulator.runtime.wire.protocol import (
    CHUNK,
    CHUNK_MAGIC,
    HELLO,
    MAX_TAG,
    ChunkHeader,
    ProtocolError,
    chunks,
    pack_hello,
    unpack_hello,
)
from testbed.emulator.runtime.worker.transport import clock
from testbed.emulator.runtime.worker.transport.send_queue import (
    ack_poll_delay,
    pace,
    unacknowledged_bytes,
)

CONNECT_TIMEOUT_S = 30.0
SCRATCH = 256 * 1024
"""What a transport that keeps no payloads reads into, a piece at a time."""


class PeerLost(Exception):
    """A peer's connection closed while we still expected data from it."""


@dataclass
class Received:
    data: bytearray | None
    """The payload; None from a transport that keeps sizes, not payloads."""
    sent_at: float
    completed_at: float
    nbytes: int


@dataclass
class _Incoming:
    total: int = -1
    got: int = 0
    buffer: bytearray = field(default_factory=bytearray)
    sent_at: float = 0.0
    arrived_at: float | None = None
    """When the last byte came, whether or not anyone was receiving yet."""
    future: asyncio.Future[Received] | None = None


class _Link(asyncio.BufferedProtocol):
    """One TCP connection: parses hello, chunk headers and payloads in place; writes with
    flow control."""

    def __init__(self, owner: Transport, peer: int | None, index: int | None) -> None:
        self.owner = owner
        self.peer = peer
        self.index = index
        self.transport: asyncio.Transport | None = None
        self._small = bytearray(max(CHUNK.size + MAX_TAG, HELLO.size))
        self._small_need = HELLO.size if peer is None else CHUNK.size
        self._small_got = 0
        self._header: tuple[int, int, int, int, float] | None = None
        self._target: _Incoming | None = None
        self._target_tag = ""
        self._payload_left = 0
        self._payload_at = 0
        self._can_write = asyncio.Event()
        self._can_write.set()
        self.closed = asyncio.get_running_loop().create_future()
        self.payload_bytes_written = 0
        """Message bytes handed to this connection (what its share of the striping was)."""

    # receiving ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._payload_left:
            assert self._target is not None
            if not self.owner.keep_payloads:
                return self.owner.scratch[: self._payload_left]
            start = self._payload_at
            return memoryview(self._target.buffer)[start : start + self._payload_left]
        return memoryview(self._small)[self._small_got : self._small_need]

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self._advance(nbytes)
        except ProtocolError as exc:
            if self.peer is not None:  # one of the run's peers broke the protocol
                self.owner._fail(PeerLost(f"peer {self.peer}: {exc}"))
            if self.transport is not None:  # a stranger is simply dropped
                self.transport.close()

    def _advance(self, nbytes: int) -> None:
        if self._payload_left:
            assert self._target is not None
            self._payload_left -= nbytes
            self._payload_at += nbytes
            self._target.got += nbytes
            if not self._payload_left:
                self._finish_chunk()
            return
        self._small_got += nbytes
        if self._small_got < self._small_need:
            return
        if self.peer is None:
            self._on_hello()
        elif self._header is None:
            magic, tag_len, total, offset, length, sent_at = CHUNK.unpack_from(self._small)
            if magic != CHUNK_MAGIC or tag_len > MAX_TAG or offset + length > total:
                raise ProtocolError("bad chunk header")
            self._header = (tag_len, total, offset, length, sent_at)
            self._small_need = CHUNK.size + tag_len
            if tag_len:
                return
            self._on_header()
        else:
            self._on_header()

    def _on_hello(self) -> None:
        token, peer, index = unpack_hello(bytes(self._small[: HELLO.size]))
        if not hmac.compare_digest(token, self.owner.token):
            raise ProtocolError("wrong run token")
        self.peer, self.index = peer, index
        self.owner._attach(peer, index, self)
        self._reset()

    def _on_header(self) -> None:
        assert self._header is not None
        tag_len, total, offset, length, sent_at = self._header
        tag = bytes(self._small[CHUNK.size : CHUNK.size + tag_len]).decode()
        entry = self.owner._entry(tag)
        if entry.total < 0:
            entry.total = total
            if self.owner.keep_payloads:
                entry.buffer = bytearray(total)
            entry.sent_at = sent_at
        self._target, self._target_tag = entry, tag
        self._payload_left, self._payload_at = length, offset
        self._reset_header()
        if not length:
            self._finish_chunk()

    def _finish_chunk(self) -> None:
        assert self._target is not None
        self.owner._maybe_complete(self._target_tag, self._target)
        self._target = None

    def _reset_header(self) -> None:
        self._header = None
        self._small_got = 0
        self._small_need = CHUNK.size

    def _reset(self) -> None:
        self._reset_header()

    def eof_received(self) -> bool | None:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)
        self._can_write.set()
        if self.peer is None:
            return  # never proved it belongs to the run: its going changes nothing
        if not self.owner.closing:
            self.owner._fail(PeerLost(f"peer {self.peer} closed its connection"))

    # sending -------------------------------------------------------------------------

    def pause_writing(self) -> None:
        self._can_write.clear()

    def resume_writing(self) -> None:
        self._can_write.set()

    async def write(self, header: bytes, data: memoryview) -> None:
        if self.transport is None or self.transport.is_closing():
            raise PeerLost(f"connection to peer {self.peer} is closed")
        self.transport.write(header)
        if len(data):
            self.transport.write(data)
        self.payload_bytes_written += len(data)
        await self._can_write.wait()


class Transport:
    """This worker's data connections to its peers."""

    def __init__(self, me: int, token: bytes, pacing: Mapping[int, float] | None = None,
                 keep_payloads: bool = True) -> None:
        """`pacing`: bytes per second per connection, for the peers whose connections are
        paced (those across the WAN); the others send as fast as TCP lets them.
        `keep_payloads`: False to receive only sizes (Received.data is None)."""
        if len(token) != 32:
            raise ValueError("the run token must be 32 bytes")
        self.me = me
        self.token = token
        self.pacing = dict(pacing or {})
        self.keep_payloads = keep_payloads
        self.scratch = memoryview(bytearray(0 if keep_payloads else SCRATCH))
        self.closing = False
        self._links: dict[int, list[_Link | None]] = {}
        self._mail: dict[str, _Incoming] = {}
        self._server: asyncio.Server | None = None
        self._expected_inbound: dict[int, int] | None = None
        self._inbound_ready = asyncio.Event()
        self._failure: BaseException | None = None
        self._send_locks: dict[int, asyncio.Lock] = {}

    # --- setting up -------------------------------------------------------------------

    async def listen(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Link(self, None, None), host, port, backlog=256
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def connect(
        self, outbound: dict[int, tuple[str, int, int]], inbound: dict[int, int]
    ) -> None:
        """Open `n` connections to each (host, port, n) in `outbound`; wait for the `n`
        connections each peer in `inbound` opens to us."""
        self._expected_inbound = dict(inbound)
        self._check_inbound()
        opens = [
            self._open(peer, host, port, i)
            for peer, (host, port, n) in outbound.items()
            for i in range(n)
        ]
        await asyncio.wait_for(asyncio.gather(*opens), CONNECT_TIMEOUT_S)
        await asyncio.wait_for(self._inbound_ready.wait(), CONNECT_TIMEOUT_S)

    async def _open(self, peer: int, host: str, port: int, index: int) -> None:
        loop = asyncio.get_running_loop()
        delay = 0.02
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                _, link = await loop.create_connection(lambda: _Link(self, peer, index), host, port)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
        assert link.transport is not None
        link.transport.write(pack_hello(self.token, self.me, index))
        self._attach(peer, index, link)

    def set_pacing(self, pacing: Mapping[int, float]) -> None:
        """Pace the connections to these peers, those already open included (a peer may
        dial before we learn the rates)."""
        self.pacing = dict(pacing)
        for peer, links in self._links.items():
            for link in links:
                if link is not None:
                    self._pace(peer, link)

    def _pace(self, peer: int, link: _Link) -> None:
        rate = self.pacing.get(peer)
        if rate and link.transport is not None:
            sock = link.transport.get_extra_info("socket")
            if sock is not None:
                pace(sock, rate)

    def _attach(self, peer: int, index: int, link: _Link) -> None:
        self._pace(peer, link)
        slots = self._links.setdefault(peer, [])
        slots.extend([None] * (index + 1 - len(slots)))
        slots[index] = link
        self._check_inbound()

    def _check_inbound(self) -> None:
        """Peers may dial before we know to expect them; count once we do."""
        if self._expected_inbound is None:
            return
        if all(
            sum(link is not None for link in self._links.get(peer, [])) >= n
            for peer, n in self._expected_inbound.items()
        ):
            self._inbound_ready.set()

    # --- moving data -----------------------------------------------------------------

    async def send(self, peer: int, tag: str, payload: bytes | bytearray | memoryview) -> float:
        """Stripe `payload` over the connections to `peer`; returns when all is written.

        The message is cut into chunks dealt in turn to the connections that have room:
        a connection slowed by a loss takes fewer, so no single flow holds the message up.
        In turn, not first come: a connection's kernel buffer takes megabytes at once, so
        the first to write would otherwise take a whole send buffer before the next took
        a chunk, and a message would ride a few connections' windows instead of all N
        (the plan's and the simulator's striping: each carries 1/N).
        """
        links = [link for link in self._links.get(peer, []) if link is not None]
        if not links:
            raise PeerLost(f"no connection to peer {peer}")
        view = memoryview(payload).cast("B")
        total = len(view)
        pieces = collections.deque(chunks(total, len(links)))
        sent_at = 0.0

        async def pump(link: _Link) -> None:
            while pieces:
                offset, length = pieces.popleft()
                header = ChunkHeader(tag, total, offset, length, sent_at).pack()
                await link.write(header, view[offset : offset + length])
                await asyncio.sleep(0)  # the next connection's turn

        # one message at a time per peer, in the order they were sent: the first
        # microbatch arrives first instead of all queued ones arriving late together
        async with self._send_locks.setdefault(peer, asyncio.Lock()):
            sent_at = clock.now()
            await asyncio.gather(*(pump(link) for link in links))
        return clock.now()

    async def acknowledged(self, peer: int) -> None:
        """Returns once every byte sent to `peer` so far is acknowledged by its host (every
        connection's send queue is empty): when a blocking send over TCP has completed."""
        links = [link for link in self._links.get(peer, []) if link is not None]
        delay, before, since = 0.0, 0, time.monotonic()
        while queued := sum(unacknowledged_bytes(link.transport) for link in links):
            if self._failure is not None:
                raise self._failure
            now = time.monotonic()
            delay = ack_poll_delay(queued, before, now - since, delay)
            before, since = queued, now
            await asyncio.sleep(delay)

    def has(self, tag: str) -> bool:
        """Whether the whole message with this tag is already here."""
        entry = self._mail.get(tag)
        return entry is not None and 0 <= entry.total <= entry.got

    def _entry(self, tag: str) -> _Incoming:
        return self._mail.setdefault(tag, _Incoming())

    async def recv(self, tag: str) -> Received:
        """The whole message with this tag, when every chunk has arrived."""
        entry = self._entry(tag)
        if entry.future is None:
            entry.future = asyncio.get_running_loop().create_future()
            self._maybe_complete(tag, entry)
        if not entry.future.done() and self._failure is not None:
            self._mail.pop(tag, None)
            raise self._failure
        try:
            return await entry.future
        finally:
            self._mail.pop(tag, None)

    def _maybe_complete(self, tag: str, entry: _Incoming) -> None:
        if entry.total < 0 or entry.got < entry.total:
            return
        if entry.arrived_at is None:
            entry.arrived_at = clock.now()
        if entry.future is not None and not entry.future.done():
            entry.future.set_result(Received(entry.buffer if self.keep_payloads else None,
                                             entry.sent_at, entry.arrived_at, entry.total))

    def _fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        for entry in self._mail.values():
            if entry.future is not None and not entry.future.done():
                entry.future.set_exception(error)

    async def close(self) -> None:
        self.closing = True
        links = _all(self._links.values())
        for link in links:
            if link.transport is not None:
                link.transport.close()
        for link in links:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(link.closed, 2.0)
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()


def _all(groups: Iterable[list[_Link | None]]) -> list[_Link]:
    return [link for group in groups for link in group if link is not None]
