"""The testbed command: one module per group of subcommands (testbed.cli.main holds the group).

Ctrl-C at any moment of a command ends it with one line and exit code 130, and SIGTERM
(`kill`) with one line and exit code 143, each once it has removed what it made. While the
command loads its modules (a second or more, before `main` runs and can catch a
KeyboardInterrupt) a handler of its own says so and ends it; `main` hands Ctrl-C back to
Python (`loaded`), and once it has done its work, ignores it (`finished`): the last steps
of Python's shutdown run without Python's handler, and a Ctrl-C there ended the process
by the signal (exit code -2) without a word. SIGTERM raises Terminated from `loaded` to
`finished`, as Ctrl-C raises KeyboardInterrupt; before and after, it ends the process as
it would any other (nothing is made yet, or all is done). Only as the `testbed` command:
code that calls `main` itself (the tests) keeps its own handling."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from testbed.common import sigint
from testbed.errors import Terminated

COMMAND = "testbed"
AS_COMMAND = (Path(getattr(sys, "argv", [""])[0] or "").name == COMMAND
              and threading.current_thread() is threading.main_thread())
"""Whether this process is the command (its script imports this first)."""


def _interrupted(_signum: int, _frame: FrameType | None) -> None:
    os.write(2, b"testbed: interrupted\n")
    os._exit(130)  # nothing is made or started yet: only modules were loading


def _terminated(_signum: int, _frame: FrameType | None) -> None:
    raise Terminated()


def loaded() -> None:
    """Ctrl-C raises KeyboardInterrupt again, and SIGTERM Terminated, for `main` to catch."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, sigint.raise_keyboard_interrupt)
    if AS_COMMAND and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _terminated)


def finished() -> None:
    """The command has done its work and said so: Ctrl-C is ignored from here on, and
    SIGTERM ends the process at once."""
    if AS_COMMAND:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if signal.getsignal(signal.SIGTERM) is _terminated:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


if AS_COMMAND and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupted)
