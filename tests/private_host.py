"""A host of a test's own making for `testbed down`: a state folder of its own, namespaces
as files in another (the kernel's functions replaced), and only the processes it started
may be taken for strays, under a module name of its own so that no other `down` on the
machine takes them for its, and no sweep's leftovers but those it names. Nothing of the
machine's is touched. Shared by tests/test_state_files.py and
scripts/soak_faults_state.py."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from testbed.common import owners
from testbed.common.owners import process_start_ticks
from testbed.emulator.net import cleanup, netns, state, sweep_leftovers

WORKER = f"testbed-test-worker-{os.getpid()}"
"""The module `down` here takes for one of ours (cleanup.OUR_MODULES)."""


class Host:
    """The host's state folder, its namespaces (files) and its processes."""

    def __init__(self, root: Path) -> None:
        self.states = root / "state"
        self.netns = root / "netns"
        self.states.mkdir(parents=True)
        self.netns.mkdir(parents=True)
        self.processes: list[subprocess.Popen[str]] = []

    def namespaces(self, *names: str) -> list[str]:
        for name in names:
            (self.netns / name).touch()
        return list(names)

    def present(self) -> set[str]:
        return {p.name for p in self.netns.iterdir()}

    def write(self, run_id: str, data: Any) -> Path:
        path = self.states / f"{run_id}.json"
        path.write_text(data if isinstance(data, str) else json.dumps(data))
        return path

    def start(self, code: str, *argv: str) -> subprocess.Popen[str]:
        proc = subprocess.Popen([sys.executable, "-c", code, *argv], stdout=subprocess.PIPE,
                                text=True)
        self.processes.append(proc)
        return proc

    def worker(self) -> int:
        """A process whose command line is one of our workers', child of this one."""
        return self.start("import time; time.sleep(120)", "-m", WORKER).pid

    def owner_with_worker(self) -> tuple[int, int]:
        """A live owner (as a run's `up` process) and its worker."""
        proc = self.start("import subprocess, sys, time\n"
                          "p = subprocess.Popen([sys.executable, '-c', 'import time; "
                          f"time.sleep(120)', '-m', '{WORKER}'])\n"
                          "print(p.pid, flush=True)\ntime.sleep(120)")
        assert proc.stdout is not None
        return proc.pid, int(proc.stdout.readline())

    def mine(self) -> set[int]:
        started = {p.pid for p in self.processes}
        return started | set(children_of(started))

    def close(self) -> None:
        for pid in children_of({p.pid for p in self.processes}):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.processes:
            proc.kill()
            proc.wait()


def children_of(parents: set[int]) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if parent in parents:
                found.append(int(entry.name))
    return found


def gone_pid() -> int:
    """The pid of a process that has exited."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def run_record(run_id: str, owner: int, namespaces: list[str], **more: Any
               ) -> dict[str, Any]:
    """A run state file's content, as this version writes it."""
    return {"run_id": run_id, "slot": 1, "prefix": "tb1-", "topology": "two-dc",
            "shaper": "netem", "namespaces": namespaces, "etc_dirs": [], "owner_pid": owner,
            "owner_ticks": process_start_ticks(owner) or 0, "processes": [], **more}


@contextlib.contextmanager
def private_host(root: Path, marks: Collection[str] = ()) -> Iterator[Host]:
    """`down` over a host made under `root` (and the sweeps' `marks` alone)."""
    host = Host(root)
    real_strays, real_find = cleanup.stray_processes, sweep_leftovers.find

    def remove_namespace(name: str) -> bool:
        (host.netns / name).unlink(missing_ok=True)
        return True

    def strays(keep: Any = frozenset()) -> list[int]:
        mine = host.mine()
        return [p for p in real_strays(keep) if p in mine]

    def find(only: Collection[str] | None = None) -> sweep_leftovers.Leftovers:
        return real_find(only=marks)

    patches: list[tuple[Any, str, Any]] = [
        (state, "STATE_DIR", host.states), (owners, "STATE_DIR", host.states),
        (netns, "NETNS_DIR", host.netns),
        (netns, "ETC_NETNS", root / "etc-netns"),
        (netns, "list_namespaces", lambda: sorted(host.present())),
        (netns, "remove_namespace", remove_namespace),
        (cleanup, "stray_processes", strays), (cleanup, "OUR_MODULES", (WORKER,)),
        (sweep_leftovers, "find", find)]
    saved = [(module, name, getattr(module, name)) for module, name, _ in patches]
    for module, name, value in patches:
        setattr(module, name, value)
    try:
        yield host
    finally:
        for module, name, value in saved:
            setattr(module, name, value)
        host.close()
