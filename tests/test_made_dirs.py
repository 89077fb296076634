"""A command killed before it wrote anything: its results directory, created empty before
it planned, is removed by `testbed down`, and nothing else is (a live command's, or one
that holds files). `down` runs over what the test made alone (tests/private_host.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed.common import made_dirs, owners
from testbed.emulator.net import cleanup

from .conftest import TOPOLOGIES
from .private_host import private_host

TESTBED = str(Path(sys.executable).parent / "testbed")


def _simulate(work: Path, states: Path, topology: str, *args: str) -> subprocess.Popen[str]:
    work.mkdir(exist_ok=True)
    return subprocess.Popen([TESTBED, "simulate", str(TOPOLOGIES / topology), *args],
                            cwd=work, env={**os.environ, "TESTBED_STATE_DIR": str(states)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _gone_identity() -> str:
    """The identity a process had, once it has exited."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    mark = owners.identity(process.pid)
    process.kill()
    process.wait()
    return mark


def test_down_removes_the_empty_directory_a_killed_command_left_and_nothing_else(
        tmp_path: Path) -> None:
    """`testbed simulate` SIGKILLed while it planned left its results directory, empty,
    under runs/, and `testbed down` left it too."""
    with private_host(tmp_path / "host") as host:
        records = host.states / made_dirs.FOLDER
        done = _simulate(tmp_path / "done", host.states, "two-dc.yaml", "-p", "gpipe", "-q")
        assert done.wait(timeout=120) == 0
        assert not list(records.iterdir())  # a command that ended took its record along

        killed = _simulate(tmp_path / "work", host.states, "paper-3dc.yaml", "-p", "atlas")
        deadline = time.monotonic() + 60
        while not (records.is_dir() and [r for r in records.iterdir()
                                         if not r.name.startswith(".")]):
            assert killed.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        os.killpg(killed.pid, signal.SIGKILL)
        killed.wait(timeout=60)
        [left] = (tmp_path / "work" / "runs").iterdir()
        assert not list(left.iterdir())

        live_dir, kept = tmp_path / "live", tmp_path / "kept"
        live_dir.mkdir()
        kept.mkdir()
        (kept / "results.json").write_text("{}")
        (records / owners.identity()).write_text(json.dumps([str(live_dir)]))
        gone = records / _gone_identity()
        gone.write_text(json.dumps([str(kept), str(tmp_path / "never-made")]))

        report = cleanup.down()
        assert report.directories == [str(left)]
        assert report.summary() == ["removed 0 runs, 0 namespaces, 0 stray processes, "
                                    "1 empty results directory"]
        assert not left.exists() and (tmp_path / "work" / "runs").is_dir()
        assert live_dir.is_dir() and (kept / "results.json").exists()
        assert sorted(r.name for r in records.iterdir()) == [owners.identity()]
        assert cleanup.down().summary() == ["nothing to remove"]
