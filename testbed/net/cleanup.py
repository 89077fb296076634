"""`testbed down`: remove whatever runs of ours left behind, and only that."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from testbed.net import netns as kernel
from testbed.net.network import clean_state
from testbed.net.state import all_states, damaged_state_files, owner_alive

OUR_MODULES = ("testbed.net.delayline", "testbed.runtime.worker", "testbed.runtime.decode")
PROBE_PREFIX = "tbprobe"


@dataclass
class DownReport:
    runs: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def nothing(self) -> bool:
        return not (self.runs or self.namespaces or self.processes)


def stray_processes() -> list[int]:
    """Processes running one of our modules, found by their command line."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [a.decode(errors="replace") for a in argv]
        if any(m in words for m in OUR_MODULES) and "-m" in words:
            found.append(int(entry.name))
    return found


def down(say: Callable[[str], None] = lambda _m: None, grace_s: float = 5.0) -> DownReport:
    report = DownReport()
    states = all_states()
    # a live run tears itself down when asked; give it the chance first
    asked = []
    for state in states:
        if state.owner_pid != os.getpid() and owner_alive(state):
            with contextlib.suppress(ProcessLookupError):
                os.kill(state.owner_pid, signal.SIGTERM)
                asked.append(state)
                say(f"asked run {state.run_id} (pid {state.owner_pid}) to stop")
    deadline = time.monotonic() + grace_s
    while asked and time.monotonic() < deadline:
        if all(not s.path.exists() for s in asked):
            break
        time.sleep(0.1)
    for state in all_states():
        present = [ns for ns in state.namespaces if (kernel.NETNS_DIR / ns).exists()]
        say(
            f"removing run {state.run_id} ({state.topology}): {len(present)} namespaces, "
            f"{len(state.processes)} processes"
        )
        report.problems += clean_state(state)
        report.runs.append(state.run_id)
        report.namespaces += present
    for name in kernel.list_namespaces():
        if name.startswith(PROBE_PREFIX) and kernel.remove_namespace(name):
            report.namespaces.append(name)
    for pid in stray_processes():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            report.processes.append(pid)
    for path in damaged_state_files():
        report.problems.append(f"removed unreadable state file {path}")
        with contextlib.suppress(OSError):
            path.unlink()
    return report
