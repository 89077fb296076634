"""SIGTERM and SIGINT for the run's child processes, taken on the event loop.

A Python-level handler that raises (`sys.exit` in `signal.signal`) runs wherever the
interpreter happens to be: inside a protocol's `get_buffer`, uvloop swallows the exit and
reports "unhandled error (or an empty buffer) in get_buffer()", closes the connection and
the worker ends by a misleading PeerLost. Handled by the loop, the signal cancels the
work between callbacks instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


async def until_signalled(work: Coroutine[Any, Any, T]) -> T | int:
    """`work`'s result, or 128 + the signal's number when SIGTERM or SIGINT ended it."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        task.cancel()

    for signum in STOP_SIGNALS:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        return await task
    except asyncio.CancelledError:
        if received:
            return 128 + received[0]
        raise
    finally:
        for signum in STOP_SIGNALS:
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(signum)
