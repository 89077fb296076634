"""`testbed down`: remove whatever runs of ours left behind, and only that."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from pathlib import Path

from testbed.common.units import plural
from testbed.net import netns as kernel
from testbed.net.state import (
    RunState,
    all_states,
    damaged_state_files,
    owner_alive,
    stale_probe,
)
from testbed.net.teardown import clean_state

OUR_MODULES = ("testbed.net.delayline", "testbed.runtime.worker.process",
               "testbed.runtime.worker.decode")


@dataclass
class DownReport:
    runs: list[str] = field(default_factory=list)
    namespaces: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    live: list[str] = field(default_factory=list)
    """Runs whose owner is alive, left alone."""
    stopped: list[str] = field(default_factory=list)
    """Live runs asked to stop that tore themselves down."""

    @property
    def nothing(self) -> bool:
        return not (self.runs or self.namespaces or self.processes or self.stopped)

    def summary(self) -> list[str]:
        """What `testbed down` prints when it is done."""
        lines = []
        if self.stopped:
            lines.append(f"stopped {plural(len(self.stopped), 'live run')} (each removed what "
                         "it had made)")
        if self.nothing:
            lines.append("nothing to remove" + (f" ({plural(len(self.live), 'live run')} left "
                                                "alone)" if self.live else ""))
        elif self.runs or self.namespaces or self.processes:
            lines.append(f"removed {plural(len(self.runs), 'run')}, "
                         f"{plural(len(self.namespaces), 'namespace')}, "
                         f"{plural(len(self.processes), 'stray process', 'stray processes')}")
        return lines


def stray_processes(keep_parents: Set[int] = frozenset()) -> list[int]:
    """Processes running one of our modules, found by their command line, whose parent is
    not a live run's owner (a live run's workers and delay lines are its children)."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        words = [a.decode(errors="replace") for a in argv]
        if any(m in words for m in OUR_MODULES) and "-m" in words and parent not in keep_parents:
            found.append(int(entry.name))
    return found


def _live(state: RunState) -> bool:
    """A run whose owner is still running, other than the caller's own."""
    return state.owner_pid != os.getpid() and owner_alive(state)


def down(say: Callable[[str], None] = lambda _m: None, grace_s: float = 5.0,
         run: str | None = None, stop_live: bool = False) -> DownReport:
    """Remove what runs left behind. A live run is left alone unless it is named (`run`)
    or `stop_live` is set; then it is asked to stop first. With no `run` named, stray
    processes of ours that belong to no live run and scratch namespaces whose maker has
    exited go too. Nothing is ours by its name alone: a topology chooses its names."""
    report = DownReport()
    chosen = [s for s in all_states() if run is None or s.run_id == run]
    if run is not None and not chosen:
        report.problems.append(f"no run {run} (see /run/testbed/)")
        return report
    asked = []
    for state in chosen:
        if not _live(state):
            continue
        if not (stop_live or run is not None):
            report.live.append(state.run_id)
            say(f"run {state.run_id} (pid {state.owner_pid}) is live: left alone "
                f"(`testbed down {state.run_id}` or `testbed down --all` stops it)")
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.owner_pid, signal.SIGTERM)
            asked.append(state)
            say(f"asked live run {state.run_id} (pid {state.owner_pid}) to stop")
    deadline = time.monotonic() + grace_s
    while asked and time.monotonic() < deadline:
        if all(not s.path.exists() for s in asked):
            break
        time.sleep(0.1)
    report.stopped = [s.run_id for s in asked if not s.path.exists()]
    ids = {s.run_id for s in chosen} - set(report.live)
    for state in all_states():
        if state.run_id not in ids:
            continue
        present = [ns for ns in state.namespaces if (kernel.NETNS_DIR / ns).exists()]
        say(
            f"removing run {state.run_id} ({state.topology}): "
            f"{plural(len(present), 'namespace')}, "
            f"{plural(len(state.processes), 'process', 'processes')}"
        )
        report.problems += clean_state(state)
        report.runs.append(state.run_id)
        report.namespaces += present
    if run is not None:
        return report
    for name in kernel.list_namespaces():
        if stale_probe(name) and kernel.remove_namespace(name):
            report.namespaces.append(name)
    owners = {s.owner_pid for s in all_states() if owner_alive(s)}
    for pid in stray_processes(owners):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            report.processes.append(pid)
    for path in damaged_state_files():
        report.problems.append(f"removed unreadable state file {path}")
        with contextlib.suppress(OSError):
            path.unlink()
    return report
