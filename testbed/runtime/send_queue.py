"""How much a connection has not yet had acknowledged: what a wait for a send's
completion watches."""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios


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
