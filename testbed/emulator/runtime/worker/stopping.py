"""How the run's child processes end: SIGTERM and SIGINT taken on the event loop, and
the exit itself (`leave`).

A Python-level handler that raises (`sys.exit` in `signal.signal`) runs wherever the
interpreter happens to be: inside a protocol's `get_buffer`, uvloop swallows the exit and
reports "unhandled error (or an empty buffer) in get_buffer()", closes the connection and
the worker ends by a misleading PeerLost. Handled by the loop, the signal cancels the
work between callbacks instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn, TypeVar

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


def leave(code: int) -> NoReturn:
    """End the process with `code`. A clean end (0) comes once every result is sent, every
    file renamed into place and every connection closed: it skips the interpreter's own
    teardown, which with torch loaded costs a worker some 0.4 s of CPU that the run's end
    waits for (its workers' at once, on shared cores). Any other end goes through it, so a
    thread still writing a file is waited for."""
    if code == 0:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    sys.exit(code)
