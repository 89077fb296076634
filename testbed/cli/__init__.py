"""The testbed command: one module per group of subcommands (testbed.cli.main holds the group).

Ctrl-C at any moment of a command ends it with one line and exit code 130. While the
command loads its modules (a second or more, before `main` runs and can catch a
KeyboardInterrupt) a handler of its own says so and ends it; `main` hands Ctrl-C back to
Python (`loaded`), and once it has done its work, ignores it (`finished`): the last steps
of Python's shutdown run without Python's handler, and a Ctrl-C there ended the process
by the signal (exit code -2) without a word. Only as the `testbed` command: code that
calls `main` itself (the tests) keeps its own handling."""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from testbed.common import sigint

COMMAND = "testbed"
AS_COMMAND = (Path(getattr(sys, "argv", [""])[0] or "").name == COMMAND
              and threading.current_thread() is threading.main_thread())
"""Whether this process is the command (its script imports this first)."""


def _interrupted(_signum: int, _frame: FrameType | None) -> None:
    os.write(2, b"testbed: interrupted\n")
    os._exit(130)  # nothing is made or started yet: only modules were loading


def loaded() -> None:
    """Ctrl-C raises KeyboardInterrupt again, for `main` to catch."""
    if signal.getsignal(signal.SIGINT) is _interrupted:
        signal.signal(signal.SIGINT, sigint.raise_keyboard_interrupt)


def finished() -> None:
    """The command has done its work and said so: Ctrl-C is ignored from here on."""
    if AS_COMMAND:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


if AS_COMMAND and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupted)
