"""A sweep stopped at any moment: SIGKILLed, it leaves no worker running (and `testbed
down` removes what a forcibly orphaned one left, its local Ray instance's too, and nothing
else); Ctrl-C ends it with one line and exit code 130, and nothing left.

Each sweep here runs as the `testbed` command in a session of its own; `down` is run
only over what the test made (its own marks, an empty state folder, no namespaces)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from testbed.common.owners import identity, process_start_ticks
from testbed.emulator.net import cleanup, sweep_leftovers
from testbed.emulator.net.sweep import descendants
from testbed.emulator.net.sweep_leftovers import MARK, OWNER_FILE, RAY_PREFIX
from testbed.experiments.sweep_store import POINTS_FILE

from .private_host import private_host
from .test_sweep import NO_RAY

ROOT = Path(__file__).resolve().parent.parent
TESTBED = str(Path(sys.executable).parent / "testbed")
GRID = ["--vary", "wan.latency=10ms,20ms,30ms,40ms,50ms,60ms", "--iterations", "400",
        "-p", "gpipe"]
"""Six points of about a second each."""


def _sweep(out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([TESTBED, "sweep", str(ROOT / "topologies" / "two-dc.yaml"),
                             *GRID, "--workers", "2", "--out", str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (not `pid` itself)."""
    return [found for found in descendants(pid) if found != pid]


def _until(condition: Callable[[], bool], proc: subprocess.Popen[str], limit: float = 120
           ) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert proc.poll() is None, f"the sweep ended first (exit code {proc.returncode})"
        assert time.monotonic() < deadline
        time.sleep(0.005)


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the sweep; its pipes closed, not read to their end (what it left running
    holds them open)."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for pipe in (proc.stdout, proc.stderr):
        assert pipe is not None
        pipe.close()


def _wait_gone(pids: list[int], limit: float = 20) -> list[int]:
    """Those of `pids` still running after `limit` seconds (a zombie has exited)."""
    deadline = time.monotonic() + limit
    while (left := [p for p in pids if process_start_ticks(p) is not None]) and \
            time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def _moment(name: str, proc: subprocess.Popen[str], out: Path) -> None:
    """Wait for a moment of the sweep: `loading` (its modules half loaded), `workers` (its
    workers just started, loading theirs), `loading workers` (half a second later),
    `points` (the first point done), `ending` (every point done, the table being made)."""
    if name == "loading":
        _until(lambda: "orjson" in Path(f"/proc/{proc.pid}/maps").read_text(), proc)
    elif name in ("workers", "loading workers"):
        _until(lambda: bool(_descendants(proc.pid)), proc)
        time.sleep(0.5 if name == "loading workers" else 0)
    elif name == "points":
        _until(lambda: (out / POINTS_FILE).exists() and bool((out / POINTS_FILE).read_text()),
               proc)
    elif name.startswith("ending"):
        assert proc.stderr is not None
        for line in proc.stderr:
            if "points done" in line:
                break
        time.sleep(float(name.split()[1]))


@pytest.mark.parametrize("moment", ["at once", "workers", "loading workers", "points"])
def test_a_killed_sweep_leaves_no_worker_behind(tmp_path: Path, moment: str) -> None:
    """A worker set PR_SET_PDEATHSIG only in its initializer, after a second or two of
    loading: a sweep SIGKILLed before then left both workers running for good (8 of 13
    kills). One that finds the sweep gone by then now exits."""
    proc = _sweep(tmp_path / "out")
    _moment(moment, proc, tmp_path / "out")
    os.kill(proc.pid, signal.SIGSTOP)  # it starts nothing more: all it started is here
    started = _descendants(proc.pid)
    _kill(proc)
    left = _wait_gone(started)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"left running after the sweep was killed {moment}"


def _orphaned(out: Path) -> tuple[str, list[int]]:
    """A sweep killed as its workers start, and its workers stopped before they could
    set their death signal: a pool forcibly orphaned. Its mark and what it left."""
    proc = _sweep(out)
    mark = identity(proc.pid)
    _moment("workers", proc, out)
    os.kill(proc.pid, signal.SIGSTOP)
    left = _descendants(proc.pid)
    # a worker forked but not yet started (exec'd) still shows the sweep's environment
    # from before its mark: stopped there it would be nobody's, which no real sweep's
    # worker stays (it goes on to start, marked)
    _until(lambda: all(_marked(pid, mark) for pid in left), proc, 30)
    for pid in left:
        os.kill(pid, signal.SIGSTOP)
    _kill(proc)
    assert left and _wait_gone(left, 0) == left, "the workers went on their own"
    return mark, left


def _marked(pid: int, mark: str) -> bool:
    """Whether the process started with the sweep's mark in its environment (or is gone)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return True
    return f"{MARK}={mark}".encode() in environ.split(b"\0")


def _down(tmp_path: Path, marks: set[str]) -> cleanup.DownReport:
    """`testbed down` over this test's own: its marks, an empty state folder, no
    namespaces, no strays (tests/private_host.py)."""
    with private_host(tmp_path / "host", marks):
        return cleanup.down()


def test_down_removes_what_a_killed_sweep_left_and_nothing_else(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`down` looked for neither a killed sweep's workers nor a Ray folder: they are
    found by the sweep's mark, once its process is gone (a live sweep's are left)."""
    mark, left = _orphaned(tmp_path / "out")
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            env={**os.environ, MARK: identity()})  # as this live "sweep"'s
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folders = {}
    for owner in (mark, identity()):
        folder = Path(tempfile.mkdtemp(prefix=RAY_PREFIX))
        (folder / OWNER_FILE).write_text(owner)
        folders[owner] = folder
    (tmp_path / f"{RAY_PREFIX}link").symlink_to(folders[mark])
    try:
        report = _down(tmp_path, {mark, identity()})
        assert sorted(report.processes) == sorted(left), report
        assert report.folders == [str(folders[mark])]
        strays = "1 stray process" if len(left) == 1 else f"{len(left)} stray processes"
        assert report.summary() == [f"removed 0 runs, 0 namespaces, {strays}, 1 sweep folder"]
        assert not _wait_gone(left, 5) and process_start_ticks(live.pid) is not None
        assert not folders[mark].exists() and folders[identity()].exists()
    finally:
        live.kill()
        live.wait()
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_down_removes_a_killed_local_ray_instance(tmp_path: Path) -> None:
    """`--ray local` killed left Ray's agents running and its temporary folder."""
    pytest.importorskip("ray", reason=NO_RAY)
    out = tmp_path / "out"
    proc = _sweep(out, "--ray", "local")
    mark = identity(proc.pid)
    _moment("points", proc, out)
    started = _descendants(proc.pid)
    _kill(proc)
    found = sweep_leftovers.find(only={mark})
    assert found.folders and set(found.processes) <= set(started)
    report = _down(tmp_path, {mark})
    assert report.folders == [str(f) for f in found.folders]
    assert not _wait_gone(started, 10) and not any(f.exists() for f in found.folders)


@pytest.mark.parametrize("moment", ["loading", "workers", "loading workers", "points",
                                    "ending 0.1", "ending 0.4"])
def test_ctrl_c_at_any_moment_of_a_sweep_is_one_line_and_130(tmp_path: Path,
                                                           moment: str) -> None:
    """Ctrl-C (SIGINT to the whole process group) while the command loaded its modules
    was a traceback of the import; while the workers loaded theirs, each printed one;
    late in Python's shutdown the process died of it (exit code -2) without a word."""
    out = tmp_path / "out"
    proc = _sweep(out)
    _moment(moment, proc, out)
    started = _descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line]
    if proc.returncode == 0 and moment.startswith("ending"):  # it had done its work
        assert (out / "sweep.csv").exists()
    else:
        assert proc.returncode == 130, err
        assert lines[-1] == "testbed: interrupted", err
        assert all(line.startswith(("simulating ", "sweep: ", "stopped after "))
                   for line in lines[:-1]), err
    assert not _wait_gone(started, 10)


def _holds(pid: int, signum: int) -> bool:
    """Whether `signum` is blocked or ignored in `pid` (its status's masks)."""
    masks = dict(line.split(":\t") for line in Path(f"/proc/{pid}/status").read_text()
                 .splitlines() if line.startswith(("SigBlk", "SigIgn")))
    return any(int(mask, 16) >> (signum - 1) & 1 for mask in masks.values())


def test_workers_hold_ctrl_c_from_their_first_moment(tmp_path: Path) -> None:
    """A worker ignored Ctrl-C from its initializer on, after a second or so of loading;
    one landing before then was a traceback of its own on the terminal (or none, when
    the sweep killed it first)."""
    proc = _sweep(tmp_path / "out")
    started: list[int] = []
    try:
        _until(lambda: any(b"spawn_main" in _cmdline(p) for p in _descendants(proc.pid)),
               proc)
        time.sleep(0.2)  # the worker loads its modules (its initializer is a second away)
        os.kill(proc.pid, signal.SIGSTOP)
        started = [p for p in _descendants(proc.pid) if b"spawn_main" in _cmdline(p)]
        assert started and all(_holds(pid, signal.SIGINT) for pid in started)
    finally:
        _kill(proc)
        for pid in _wait_gone(started):
            os.kill(pid, signal.SIGKILL)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
