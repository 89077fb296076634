"""Undoing a run from its state record: its processes (only those that are still what we
started), namespaces, /etc/netns entries, the host setting it changed, its state file.
Shared by a run's own teardown and by `testbed down`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from testbed.common.owners import process_start_ticks
from testbed.emulator.net import netns as kernel
from testbed.emulator.net.state import ProcessRecord, RunState, all_states
from testbed.emulator.net.sweep import GROUP_PREFIX, remove_group, sweep_namespaces

ALLOWED_CC = "net.ipv4.tcp_allowed_congestion_control"


def stop_processes(
    records: list[ProcessRecord],
    procs: dict[int, subprocess.Popen[str] | None] | None = None,
    grace_s: float = 2.0,
) -> None:
    """SIGTERM all, wait, SIGKILL the rest; only pids that still name what we started."""
    procs = procs or {}
    live = [r for r in records if process_start_ticks(r.pid) == r.start_ticks]
    for record in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while live and time.monotonic() < deadline:
        for record in live:
            proc = procs.get(record.pid)
            if proc is not None:
                proc.poll()
        live = [r for r in live if process_start_ticks(r.pid) == r.start_ticks]
        if live:
            time.sleep(0.02)
    for record in live:
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGKILL)
    for proc in procs.values():
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.wait(timeout=5)


def clean_state(
    state: RunState, procs: dict[int, subprocess.Popen[str] | None] | None = None
) -> list[str]:
    """Undo one run from its state record: processes, namespaces, /etc/netns, state file."""
    problems: list[str] = []
    try:
        stop_processes(list(reversed(state.processes)), procs)
    except Exception as exc:  # keep tearing down
        problems.append(f"stopping processes: {exc}")
    problems += _sweep(state)
    for ns in reversed(state.namespaces):
        try:
            kernel.remove_namespace(ns)
        except Exception as exc:
            problems.append(f"namespace {ns}: {exc}")
    for directory in state.etc_dirs:
        kernel.remove_etc_dir(directory)
    before = state.info.get("allowed_cc_before")
    if before and not any(s.run_id != state.run_id for s in all_states()):
        with contextlib.suppress(OSError):
            kernel.write_root_sysctl(ALLOWED_CC, before)
    stats_dir = state.path.with_suffix("")
    if stats_dir.is_dir():
        for child in stats_dir.iterdir():
            with contextlib.suppress(OSError):
                child.unlink()
        with contextlib.suppress(OSError):
            stats_dir.rmdir()
    leftover = [ns for ns in state.namespaces if (kernel.NETNS_DIR / ns).exists()]
    if leftover:
        problems.append(f"namespaces still present: {', '.join(leftover)}")
    else:
        state.remove()
    return problems


def _sweep(state: RunState) -> list[str]:
    """What a launched program started and no record names (its own children, one that
    left its process group): for a run of `testbed launch` (`launch` in the state's info),
    its cgroup (`cgroup`) killed and removed, then any process still inside its
    namespaces. Other runs' processes are all recorded, and left to the above."""
    problems: list[str] = []
    if not state.info.get("launch"):
        return problems
    group = state.info.get("cgroup")
    if isinstance(group, str) and Path(group).name.startswith(GROUP_PREFIX):
        problems += remove_group(Path(group))
    try:
        sweep_namespaces(state.namespaces)
    except Exception as exc:
        problems.append(f"sweeping the namespaces: {exc}")
    return problems


def clean_own_states() -> list[str]:
    """Undo every run this process made, from its state files: also one that a stop
    signal caught between its bring-up returning and the caller holding the network."""
    me = os.getpid()
    ticks = process_start_ticks(me)
    problems: list[str] = []
    for state in all_states():
        if state.owner_pid == me and state.owner_ticks == ticks:
            problems += clean_state(state)
    return problems
