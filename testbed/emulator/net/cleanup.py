"""`testbed down`: remove whatever runs of ours left behind, and only that."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Callable, Set
from dataclasses import dataclass, field
from pathlib import Path

from testbed.common import made_dirs
from testbed.common.units import plural
from testbed.emulator.net import netns as kernel
from testbed.emulator.net import sweep_leftovers
from testbed.emulator.net.state import (
    DamagedState,
    RunState,
    owner_alive,
    read_states,
    stale_probe,
)
from testbed.emulator.net.teardown import clean_state

OUR_MODULES = ("testbed.emulator.net.delayline", "testbed.emulator.runtime.worker.process",
               "testbed.emulator.runtime.worker.decode")


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
    folders: list[str] = field(default_factory=list)
    """Killed sweeps' Ray folders."""
    directories: list[str] = field(default_factory=list)
    """Results directories killed commands had created and left empty."""

    @property
    def removed(self) -> bool:
        """Whether `down` removed anything itself (besides what stopped runs removed)."""
        return bool(self.runs or self.namespaces or self.processes or self.folders
                    or self.directories)

    @property
    def nothing(self) -> bool:
        return not (self.removed or self.stopped)

    def summary(self) -> list[str]:
        """What `testbed down` prints when it is done."""
        lines = []
        if self.stopped:
            lines.append(f"stopped {plural(len(self.stopped), 'live run')} (each removed what "
                         "it had made)")
        if self.nothing:
            lines.append("nothing to remove" + (f" ({plural(len(self.live), 'live run')} left "
                                                "alone)" if self.live else ""))
        elif self.removed:
            folders = f", {plural(len(self.folders), 'sweep folder')}" if self.folders else ""
            named = plural(len(self.directories), "empty results directory",
                           "empty results directories")
            empty = f", {named}" if self.directories else ""
            lines.append(f"removed {plural(len(self.runs), 'run')}, "
                         f"{plural(len(self.namespaces), 'namespace')}, "
                         f"{plural(len(self.processes), 'stray process', 'stray processes')}"
                         f"{folders}{empty}")
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
    processes of ours that belong to no live run, scratch namespaces whose maker has
    exited, what killed sweeps left and the results directories killed commands left
    empty go too. Nothing is ours by its name alone: a
    topology chooses its names.

    A state file that does not read as a run's (damaged, or another version's) is
    undone as far as it reads (the namespaces and processes it names), and removed, once
    its owner is provably gone; while its owner lives it is a live run. One that does
    not name its owner is left, and so are stray processes, which may be its run's,
    unless it is named (`run`): the caller vouches that it is dead."""
    report = DownReport()
    states, damaged = read_states()
    chosen = [s for s in states if run is None or s.run_id == run]
    broken = [d for d in damaged if run is None or d.salvaged.run_id == run]
    if run is not None and not chosen and not broken:
        report.problems.append(f"no run {run} (see /run/testbed/)")
        return report
    asked = []
    for state in chosen + [d.salvaged for d in broken if d.owner_known]:
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
        if all(not s.path.exists() or not owner_alive(s) for s in asked):
            break
        time.sleep(0.1)
    report.stopped = [s.run_id for s in asked if not s.path.exists()]
    ids = {s.run_id for s in chosen} - set(report.live)
    states, damaged = read_states()
    for state in states:
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
    unowned = _damaged(damaged, states, run, stop_live, report)
    if run is not None:
        return report
    for name in kernel.list_namespaces():
        if stale_probe(name) and kernel.remove_namespace(name):
            report.namespaces.append(name)
    if unowned:
        report.problems.append("stray processes left alone: a state file that names no "
                               "owner may be a live run's")
    else:
        states, damaged = read_states()
        owners = {s.owner_pid for s in states if owner_alive(s)} | {
            d.salvaged.owner_pid for d in damaged if not d.owner_gone()}
        for pid in stray_processes(owners):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                report.processes.append(pid)
    sweeps = sweep_leftovers.find()
    report.problems += sweep_leftovers.remove(sweeps)
    report.processes += list(sweeps.processes)
    report.folders += [str(f) for f in sweeps.folders]
    report.directories += [str(d) for d in made_dirs.remove_left()]
    return report


def _damaged(damaged: list[DamagedState], states: list[RunState], run: str | None,
             stop_live: bool, report: DownReport) -> bool:
    """Undo the damaged state files whose owner is gone, was asked to stop, or that `run`
    names, as far as they read (never a namespace a live run's file names); whether one
    was left that names no owner."""
    unowned = False
    for broken in damaged:
        named = broken.salvaged.run_id == run
        if run is not None and not named:
            continue
        if not (named or broken.owner_gone() or (stop_live and broken.owner_known)):
            if not broken.owner_known:
                unowned = True
                report.problems.append(
                    f"state file {broken.path} does not read ({broken.problem}) and names "
                    f"no owner: left alone, as it may be a live run's (`testbed down "
                    f"{broken.salvaged.run_id}` removes it, and what it names)")
            continue
        claimed = {ns for s in states if owner_alive(s) for ns in s.namespaces} | {
            ns for d in damaged if d is not broken and not d.owner_gone()
            for ns in d.salvaged.namespaces}
        state = dataclasses.replace(broken.salvaged, namespaces=[
            ns for ns in broken.salvaged.namespaces if ns not in claimed])
        present = [ns for ns in state.namespaces if (kernel.NETNS_DIR / ns).exists()]
        report.problems.append(f"state file {broken.path} did not read ({broken.problem}): "
                               f"removed what it names ({plural(len(present), 'namespace')}, "
                               f"{plural(len(state.processes), 'process', 'processes')})")
        report.problems += clean_state(state)
        report.runs.append(state.run_id)
        report.namespaces += present
    return unowned
