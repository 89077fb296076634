"""A connection's send side: its pacing cap, and how much it has not yet had
acknowledged (what a wait for a send's completion watches)."""

from __future__ import annotations

import asyncio
import fcntl
import socket
import struct
import termios

SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)
"""Linux's per-socket pacing cap (asm-generic/socket.h); TCP paces itself to it without
the fq qdisc (internal pacing, since Linux 4.13)."""
NOTSENT_LOWAT_S = 0.02
"""Unsent data a paced connection may hold in the kernel, in seconds at its rate: chunks
stay in the shared queue until a connection is about to need them, so all N connections
finish a message together, and an event loop that wakes late still finds data queued."""
MIN_NOTSENT_LOWAT = 128 * 1024
ACK_POLL_S = 0.0005
"""The finest a wait for acknowledgement looks at the send queues."""
ACK_DRAINING_MAX_S = 0.02
ACK_STALLED_MAX_S = 0.002


def ack_poll_delay(queued: int, before: int, elapsed_s: float, delay_s: float) -> float:
    """How long a wait for acknowledgement sleeps before it looks again: a quarter of the
    time the queue would take to drain at the rate it drained since the last look (so it
    wakes late only if that rate quadruples), else twice as long as last time while
    nothing drains, within bounds. Polling every 0.5 ms cost a worker waiting out a
    message on a slow link ~2,000 wake-ups a second; this looks a few dozen times."""
    if before and queued < before and elapsed_s > 0:
        left_s = queued * elapsed_s / (before - queued)
        return min(ACK_DRAINING_MAX_S, max(ACK_POLL_S, left_s / 4))
    if not before:
        return ACK_POLL_S
    return min(ACK_STALLED_MAX_S, max(ACK_POLL_S, 2 * delay_s))


def unacknowledged_bytes(transport: asyncio.Transport | None) -> int:
    """Bytes still in this process's buffer or in the kernel's send queue (sent but not
    acknowledged, or not yet sent: SIOCOUTQ, which Linux answers for TIOCOUTQ)."""
    if transport is None or transport.is_closing():
        return 0
    queued = transport.get_write_buffer_size()
    sock = transport.get_extra_info("socket")
    if sock is not None:
        raw = fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))
        queued += struct.unpack("i", raw)[0]
    return int(queued)


def pace(sock: socket.socket, bytes_per_s: float) -> None:
    """Cap one TCP socket's sending rate, so N striped connections together leave at the
    path's rate instead of bursting whole windows into its bottleneck queue."""
    sock.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, struct.pack("=Q", int(bytes_per_s)))
    lowat = max(MIN_NOTSENT_LOWAT, int(bytes_per_s * NOTSENT_LOWAT_S))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, lowat)
