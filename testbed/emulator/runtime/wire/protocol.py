"""Framing on the wire: JSON control messages between coordinator and workers, and the
small header in front of each chunk of a striped tensor between workers."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from dataclasses import dataclass

from testbed.common.codec import JsonObject
from testbed.plan.striping import chunk_bytes

MAX_CONTROL_BYTES = 64 * 1024 * 1024
MAX_UNPROVEN_BYTES = 4096
"""The longest frame read from a peer that has not proven the run's secret yet (a hello or
a join, a few hundred bytes); a longer one is refused from its length alone, unread."""
TOKEN_ENV = "TESTBED_RUN_TOKEN"
"""How a worker learns the run's secret: never on a command line, where `ps` shows it."""
_LENGTH = struct.Struct("!I")

# magic, tag length, total bytes, offset, chunk bytes, sender's clock at send start
CHUNK = struct.Struct("!4sHQQQd")
CHUNK_MAGIC = b"TBC1"
HELLO = struct.Struct("!4s32sHH")
HELLO_MAGIC = b"TBH1"
MAX_TAG = 512


LIVENESS = {"TCP_KEEPIDLE": 5, "TCP_KEEPINTVL": 2, "TCP_KEEPCNT": 5, "TCP_USER_TIMEOUT": 15_000}
"""A control connection across machines breaks within about 15 s of its peer's machine
going silent: probes when idle, a bound on unacknowledged data when not."""


def keep_alive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in LIVENESS.items():
        sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


class ProtocolError(Exception):
    """A peer sent something that is not our protocol."""


async def send_message(writer: asyncio.StreamWriter, message: JsonObject) -> None:
    writer.write(frame(message))
    await writer.drain()


def frame(message: JsonObject) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return _LENGTH.pack(len(body)) + body


async def read_message(reader: asyncio.StreamReader, limit: int = MAX_CONTROL_BYTES
                       ) -> JsonObject:
    """The next control message; ProtocolError for one longer than `limit` (before its
    body is read) or one that is not a JSON object."""
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    return _body(await reader.readexactly(_checked(length, limit)))


def read_message_blocking(sock: socket.socket, limit: int = MAX_CONTROL_BYTES
                          ) -> JsonObject:
    """The next control message from a blocking socket (before any event loop runs)."""
    (length,) = _LENGTH.unpack(_exactly(sock, _LENGTH.size))
    return _body(_exactly(sock, _checked(length, limit)))


def _checked(length: int, limit: int) -> int:
    if length > limit:
        raise ProtocolError(f"control message of {length} bytes (at most {limit})")
    return length


def _body(raw: bytes) -> JsonObject:
    try:  # UTF-8 only; bad UTF-8 and bad JSON are ValueErrors, deep nesting recursion
        data = json.loads(raw.decode())
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"control message is not JSON: {str(exc)[:80]}") from None
    if not isinstance(data, dict):
        raise ProtocolError("control message is not an object")
    return data


def _exactly(sock: socket.socket, size: int) -> bytes:
    parts, left = [], size
    while left:
        part = sock.recv(left)
        if not part:
            raise ConnectionError("the coordinator closed the connection")
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


@dataclass(frozen=True)
class ChunkHeader:
    tag: str
    total: int
    offset: int
    length: int
    sent_at: float

    def pack(self) -> bytes:
        tag = self.tag.encode()
        if len(tag) > MAX_TAG:
            raise ValueError(f"tag too long: {self.tag[:40]}...")
        return (
            CHUNK.pack(CHUNK_MAGIC, len(tag), self.total, self.offset, self.length, self.sent_at)
            + tag
        )


async def read_chunk_header(reader: asyncio.StreamReader) -> ChunkHeader:
    magic, tag_len, total, offset, length, sent_at = CHUNK.unpack(
        await reader.readexactly(CHUNK.size)
    )
    if magic != CHUNK_MAGIC or tag_len > MAX_TAG or offset + length > total:
        raise ProtocolError("bad chunk header")
    tag = (await reader.readexactly(tag_len)).decode()
    return ChunkHeader(tag, total, offset, length, sent_at)


def pack_hello(token: bytes, peer_index: int, connection: int) -> bytes:
    """First bytes on a data connection: the run's secret, who we are, which connection."""
    return HELLO.pack(HELLO_MAGIC, token, peer_index, connection)


def unpack_hello(data: bytes) -> tuple[bytes, int, int]:
    magic, token, peer_index, connection = HELLO.unpack(data)
    if magic != HELLO_MAGIC:
        raise ProtocolError("not a testbed data connection")
    return token, peer_index, connection


def chunks(total: int, connections: int) -> list[tuple[int, int]]:
    """(offset, length) pieces of a `total`-byte message for `connections` connections to
    share (testbed.plan.striping). An empty message is one empty piece."""
    if total == 0:
        return [(0, 0)]
    size = chunk_bytes(total, connections)
    return [(offset, min(size, total - offset)) for offset in range(0, total, size)]
