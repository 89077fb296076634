"""Ctrl-C, noted where it arrives. Python runs a signal's handler at the next bytecode it
executes, which may be a finalizer the garbage collector runs (`__del__`, a weakref
callback): the KeyboardInterrupt raised there is printed as "Exception ignored" and lost,
and the command would go on to finish as if nothing had happened. The command asks at its
end whether a Ctrl-C came (`arrived`) and ends as interrupted all the same."""

from __future__ import annotations

import signal
from types import FrameType

_arrived = False


def note() -> None:
    """A SIGINT arrived (called from the handlers that raise for it)."""
    global _arrived
    _arrived = True


def arrived() -> bool:
    """Whether a SIGINT reached one of the noting handlers in this process."""
    return _arrived


def raise_keyboard_interrupt(signum: int, frame: FrameType | None) -> None:
    """Python's default handler, noting the signal first."""
    note()
    signal.default_int_handler(signum, frame)


def is_default(handler: object) -> bool:
    """Whether `handler` raises KeyboardInterrupt as Python's default does."""
    return handler is signal.default_int_handler or handler is raise_keyboard_interrupt
