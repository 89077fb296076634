"""Who made what, for `testbed down`: a process named by its pid and start time (a later
process given the same pid is another one), and the folder where commands record what
they make while they run (/run/testbed: tmpfs, gone with a reboot; TESTBED_STATE_DIR
names another)."""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR = Path(os.environ.get("TESTBED_STATE_DIR", "/run/testbed"))


def process_start_ticks(pid: int) -> int | None:
    """A live process's start time in clock ticks, to tell it from a later one with the same
    pid; None once it has exited."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None  # exited; only waiting to be reaped
    return int(fields[19])


def identity(pid: int | None = None) -> str:
    """A process as a record or mark names it: `PID-TICKS` (its start time tells it from a
    later process with the same pid)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{process_start_ticks(pid) or 0}"


def gone(mark: str) -> bool:
    """Whether the process a mark names has provably exited (a mark that does not read as
    one names nothing, and nothing of it is removed)."""
    pid, _, ticks = mark.partition("-")
    if not (pid.isdigit() and ticks.isdigit() and int(pid) > 0 and int(ticks) > 0):
        return False
    return process_start_ticks(int(pid)) != int(ticks)
