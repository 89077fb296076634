"""How a message is cut over a pair's striped connections: the one rule both backends
assume. The emulator's transport deals the pieces to its connections in turn as they have
room (testbed.emulator.runtime.worker.transport); the flow model follows the same pieces
where a lossy path makes its connections' windows differ (testbed.sim.flows)."""

from __future__ import annotations

MIN_CHUNK = 64 * 1024
MAX_CHUNK = 1024 * 1024
CHUNKS_PER_CONNECTION = 16
"""The last piece decides when a message is complete: with 16 pieces per connection the
connections finish within about 1/16 of the message time of each other."""
CHUNKS_AT_START = 2
"""Pieces each connection takes as a message starts, before any has sent a byte: a
connection's write returns at once until its user-space buffer passes asyncio's high-water
mark (64 KiB) beyond what the kernel took (a fresh socket's 16 KiB send buffer), so the
first piece leaves the writer free and the second makes it wait for room. Measured: on a
lossy path the connection whose first loss came earliest carried two pieces, and the
others four or five (`scripts/bench_peers.py --emulator stripes`)."""


def chunk_bytes(total: int, connections: int) -> int:
    """The size of a `total`-byte message's pieces over `connections` connections: 64 KiB
    to 1 MiB, about 16 per connection when the message is large enough."""
    per = max(1, connections) * CHUNKS_PER_CONNECTION
    return max(MIN_CHUNK, min(MAX_CHUNK, -(-total // per)))
