"""Run state files that do not read as this version's, and what `testbed down` does with
them: another version's keys are ignored, a damaged file is undone as far as it reads once
its owner is provably gone, and a live owner's run (its workers among it) is left alone.
Every `down` here runs over a host of the test's own making (tests/private_host.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.common.owners import process_start_ticks
from testbed.emulator.net import cleanup, netns, state

from .private_host import Host, private_host
from .private_host import gone_pid as _gone_pid
from .private_host import run_record as _run

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def host(tmp_path: Path) -> Iterator[Host]:
    with private_host(tmp_path) as made:
        yield made


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a process SIGKILLed a moment ago is given a second to go)."""
    deadline = time.monotonic() + 1
    while process_start_ticks(pid) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    return process_start_ticks(pid) is not None


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
