"""Run state files that do not read as this version's, and what `testbed down` does with
them: another version's keys are ignored, a damaged file is undone as far as it reads once
its owner is provably gone, and a live owner's run (its workers among it) is left alone.

Every test here runs `down` on a host of its own making: a state folder in tmp_path,
namespaces as files in another (the kernel's functions replaced), and only processes the
test started may be taken for strays. Nothing of the machine's is touched."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.net import cleanup, netns, state, sweep_leftovers
from testbed.net.state import process_start_ticks

ROOT = Path(__file__).resolve().parent.parent
WORKER = f"testbed-test-worker-{os.getpid()}"
"""The module `down` here takes for one of ours (cleanup.OUR_MODULES): a name of its
own, so that no other `down` on this machine (another test's) takes its processes for
strays, and this one takes no one else's."""


class Host:
    """The test's host: its state folder, its namespaces (files) and its processes."""

    def __init__(self, root: Path) -> None:
        self.states = root / "state"
        self.netns = root / "netns"
        self.states.mkdir()
        self.netns.mkdir()
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


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Host]:
    made = Host(tmp_path)

    def remove_namespace(name: str) -> bool:
        (made.netns / name).unlink(missing_ok=True)
        return True

    def strays(keep: Any = frozenset()) -> list[int]:
        """Of the strays `down` finds, those this test started (and theirs)."""
        started = {p.pid for p in made.processes}
        mine = started | set(_children_of(started))
        return [p for p in real_strays(keep) if p in mine]

    real_strays = cleanup.stray_processes
    real_find = sweep_leftovers.find
    monkeypatch.setattr(state, "STATE_DIR", made.states)
    monkeypatch.setattr(netns, "NETNS_DIR", made.netns)
    monkeypatch.setattr(netns, "ETC_NETNS", tmp_path / "etc-netns")
    monkeypatch.setattr(netns, "list_namespaces", lambda: sorted(made.present()))
    monkeypatch.setattr(netns, "remove_namespace", remove_namespace)
    monkeypatch.setattr(cleanup, "stray_processes", strays)
    monkeypatch.setattr(cleanup, "OUR_MODULES", (WORKER,))
    monkeypatch.setattr(sweep_leftovers, "find", lambda: real_find(only=()))
    try:
        yield made
    finally:
        started = {p.pid for p in made.processes}
        for pid in _children_of(started):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in made.processes:
            proc.kill()
            proc.wait()


def _children_of(parents: set[int]) -> list[int]:
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


def _gone_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(done.stdout)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a process SIGKILLed a moment ago is given a second to go)."""
    deadline = time.monotonic() + 1
    while process_start_ticks(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    return process_start_ticks(pid) is not None


def _run(run_id: str, owner: int, namespaces: list[str], **more: Any) -> dict[str, Any]:
    return {"run_id": run_id, "slot": 1, "prefix": "tb1-", "topology": "two-dc",
            "shaper": "netem", "namespaces": namespaces, "etc_dirs": [], "owner_pid": owner,
            "owner_ticks": process_start_ticks(owner) or 0, "processes": [], **more}


def test_a_state_file_of_another_version_reads_without_the_keys_it_does_not_know(
        host: Host) -> None:
    """Such a file was damaged, so a bare `down` removed it and killed its run's workers."""
    owner, worker = host.owner_with_worker()
    names = host.namespaces("tb1-east-0", "tb1-west-0")
    data = _run("r-next", owner, names, schema=2, gpus={"east-0": "a100"},
                processes=[{"pid": worker, "start_ticks": process_start_ticks(worker),
                            "role": "worker:east-0", "rank": 0}])
    host.write("r-next", data)
    (run,) = state.all_states()
    assert (run.run_id, run.namespaces, run.processes[0].pid) == ("r-next", names, worker)
    report = cleanup.down()
    assert report.live == ["r-next"] and report.nothing
    assert host.present() == set(names) and _alive(worker)
    assert (host.states / "r-next.json").exists()


def test_a_damaged_state_file_whose_owner_lives_is_a_live_run(host: Host) -> None:
    """Another version that changed a known key: what reads (its owner) says it is live,
    and its workers are not strays."""
    owner, worker = host.owner_with_worker()
    names = host.namespaces("tb2-east-0")
    host.write("r-live", {**_run("r-live", owner, names), "namespaces": {"hosts": names}})
    assert state.all_states() == [] and state.damaged_state_files()
    report = cleanup.down()
    assert report.live == ["r-live"] and not report.processes, report
    assert _alive(worker) and host.present() == set(names)
    assert (host.states / "r-live.json").exists()


def test_a_damaged_state_file_whose_owner_is_gone_is_undone_as_far_as_it_reads(
        host: Host) -> None:
    """It was deleted alone: its namespaces leaked, its processes ran on."""
    leftover = host.worker()
    names = host.namespaces("tb3-east-0", "tb3-west-0")
    host.namespaces("east-0")  # someone else's
    data = _run("r-dead", _gone_pid(), names, processes=[
        {"pid": leftover, "start_ticks": process_start_ticks(leftover), "role": "worker:x"},
        {"pid": -1, "start_ticks": 0, "role": "kill every process"}])
    path = host.write("r-dead", data)
    (damaged,) = state.damaged_states()
    assert damaged.problem == "processes: expected a whole number from 1"
    assert damaged.owner_gone()
    assert [p.pid for p in damaged.salvaged.processes] == [leftover]
    report = cleanup.down()
    assert report.runs == ["r-dead"] and sorted(report.namespaces) == sorted(names)
    assert host.present() == {"east-0"} and not _alive(leftover) and not path.exists()
    assert any(p.startswith(f"state file {path} did not read (processes: ")
               for p in report.problems)


def test_a_state_file_that_names_no_owner_is_left_and_so_are_stray_processes(
        host: Host) -> None:
    """Nothing proves its run is over, and any process of ours may be that run's; naming
    the run (`down RUN`) vouches that it is, and removes it."""
    stray = host.worker()
    path = host.write("r-torn", '{"run_id": "r-torn", "namespaces": ["tb4-east-0"], "ow')
    host.namespaces("tb4-east-0")
    report = cleanup.down()
    assert path.exists() and _alive(stray) and host.present() == {"tb4-east-0"}
    assert any("names no owner: left alone" in p for p in report.problems), report.problems
    named = cleanup.down(run="r-torn")
    assert named.runs == ["r-torn"] and not path.exists()
    assert cleanup.down().processes == [stray] and not _alive(stray)


@pytest.mark.parametrize(("data", "problem"), [
    ('{"run_id": "r-x"', "unreadable"),
    ("[1, 2]", "not a JSON object"),
    ("[" * 100 + "]" * 100, "nested deeper"),
    (json.dumps(_run("r-other", 1, [])), "names run 'r-other', not its own"),
    (json.dumps({**_run("r-x", 1, []), "namespaces": ["../../etc"]}),
     "expected a list of names"),
    (json.dumps({**_run("r-x", 1, []), "owner_pid": 0}), "expected a whole number from 1"),
    (json.dumps({**_run("r-x", 1, []), "owner_pid": True}), "expected a whole number from 1"),
    (json.dumps({**_run("r-x", 1, []), "ready": "yes"}), "ready: expected bool"),
    (json.dumps({k: v for k, v in _run("r-x", 1, []).items() if k != "slot"}), "no 'slot'"),
])
def test_what_makes_a_state_file_damaged(host: Host, data: str, problem: str) -> None:
    host.write("r-x", data)
    (damaged,) = state.damaged_states()
    assert problem in damaged.problem
    assert damaged.salvaged.run_id == "r-x" and not damaged.salvaged.namespaces


def test_a_path_out_of_etc_netns_is_never_cleaned(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`/etc/netns/..` is under /etc/netns by its parent, and is /etc."""
    etc = tmp_path / "etc"
    (etc / "netns").mkdir(parents=True)
    (etc / "passwd").write_text("root")
    monkeypatch.setattr(netns, "ETC_NETNS", etc / "netns")
    netns.remove_etc_dir(str(etc / "netns" / ".."))
    assert (etc / "passwd").exists()


def test_listing_runs_reads_what_it_can(host: Host) -> None:
    """`net ls` lists another version's run, and a deep or damaged file breaks nothing."""
    info = {"run_id": "r-ok", "topology": "two-dc", "shaper": "netem", "nodes": [],
            "links": []}
    host.write("r-ok", _run("r-ok", os.getpid(), [], ready=True, info=info, later="key"))
    host.write("r-deep", "[" * 100_000 + "]" * 100_000)
    host.write("r-bad", "{")
    done = subprocess.run([sys.executable, "-c", "from testbed.cli.main import main; main()",
                           "net", "ls"], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "TESTBED_STATE_DIR": str(host.states)})
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert done.stdout.splitlines()[0] == "network r-ok: topology two-dc, shaper netem"
