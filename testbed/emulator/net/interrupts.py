"""SIGTERM and Ctrl-C for the commands that make a network in their own process (`net
up`, `net check`): never half a network, never a lost signal.

A Python handler that raises wherever the interpreter happens to be can land in a logging
lock's fork hook (the exception is printed as ignored, the signal is lost and the network
comes up anyway) or between pyroute2's helper making a namespace and its parent seeing it
(the namespace then outlives the teardown). So inside `critical()` (making or removing the
network) a signal is only recorded, and raised at the next `stop_point()`, which the
bring-up passes between its steps; elsewhere it is raised at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from types import FrameType

from testbed.errors import Terminated

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_MAIN_PID = os.getpid()
_pending: list[int] = []
_critical = [0]


def stop_point() -> None:
    """Raise the stop signal that arrived, if one did (once): Terminated for SIGTERM,
    KeyboardInterrupt for SIGINT."""
    if _pending:
        signum = _pending.pop(0)
        _pending.clear()
        raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextlib.contextmanager
def critical() -> Iterator[None]:
    """While inside, a stop signal waits for the next stop_point (or the end of the
    command) instead of landing in the middle of a step."""
    _critical[0] += 1
    try:
        yield
    finally:
        _critical[0] -= 1


def _on_signal(signum: int, frame: FrameType | None) -> None:
    if os.getpid() != _MAIN_PID:
        os._exit(128 + signum)  # a forked helper (pyroute2's) must not unwind our stack
    _pending.append(signum)
    if not _critical[0]:
        stop_point()


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """SIGTERM and SIGINT raise Terminated and KeyboardInterrupt, deferred inside
    `critical()`; what is still pending at the end is dropped (the command ends anyway)."""
    previous = {signum: signal.signal(signum, _on_signal) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _pending.clear()
