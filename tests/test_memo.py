"""Planning answers kept across commands: read back only for the same key on the same
code, the same plan and results as a fresh search, and a store that cannot be written
costs nothing but the saving."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.common.memo import DiskMemo, NoMemo, code_version, user_memo
from testbed.experiments.inputs import load_inputs
from testbed.policy import training_policy
from testbed.sim.planning import keeping_answers, plan_with_simulator

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The store on, in a folder of this test's own."""
    monkeypatch.setenv("TESTBED_CACHE", "on")
    monkeypatch.setenv("TESTBED_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_an_answer_is_read_back_only_for_its_key_and_its_code(tmp_path: Path) -> None:
    memo = DiskMemo(tmp_path / "a.sqlite", "v1")
    assert memo.get(("k", 1)) is None
    memo.put(("k", 1), (1.5, [2, "x"]))
    assert memo.get(("k", 1)) == (1.5, [2, "x"])
    assert memo.get(("k", 2)) is None
    assert DiskMemo(tmp_path / "a.sqlite", "v2").get(("k", 1)) is None  # other code
    assert DiskMemo(tmp_path / "a.sqlite", "v1").get(("k", 1)) == (1.5, [2, "x"])


def test_a_store_keeps_its_newest_answers(tmp_path: Path) -> None:
    """The oldest written go first; one written again is new."""
    store = DiskMemo(tmp_path / "answers.sqlite", "v1", keep=3)
    for key in ("a", "b", "c"):
        store.put(key, key.upper())
    store.put("a", "A again")
    store.put("d", "D")
    assert [store.get(key) for key in "abcd"] == ["A again", None, "C", "D"]


def test_a_store_that_cannot_be_written_warns_once_and_keeps_nothing(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    memo = DiskMemo(blocked / "a.sqlite", "v1")  # its folder is a file
    with pytest.warns(UserWarning, match="not keeping planning answers") as caught:
        memo.put("k", 1)
        assert memo.get("k") is None
    assert len(caught) == 1


def test_the_store_is_off_where_the_user_says_so(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    monkeypatch.setenv("TESTBED_CACHE", "off")
    assert isinstance(user_memo(["testbed"]), NoMemo)
    monkeypatch.setenv("TESTBED_CACHE", "on")
    monkeypatch.setenv("TESTBED_CACHE_DIR", str(tmp_path))
    memo = user_memo(["testbed"])
    assert isinstance(memo, DiskMemo) and memo.path.parent == tmp_path
    monkeypatch.delenv("TESTBED_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    memo = user_memo(["testbed"])
    assert isinstance(memo, DiskMemo) and memo.path.parent == tmp_path / "xdg" / "testbed"


def test_the_code_version_changes_with_any_source_file_of_the_package(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "kept_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "sub" / "policy.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "modules", dict(sys.modules))  # imported here, gone after
    importlib.import_module("kept_pkg.sub.policy")
    before = code_version(["kept_pkg.sub.policy"])
    assert code_version(["kept_pkg.sub.policy"]) == before
    (package / "sub" / "policy.py").write_text("X = 22\n")
    assert code_version(["kept_pkg.sub.policy"]) != before


def test_atlas_reads_its_search_back_and_plans_the_same(kept: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A second plan of the same inputs runs no simulation and makes the same plan, with
    the same candidates and reasons, and so does one of a longer run with requests to
    serve (the search simulates a few iterations of training alone); other inputs
    search again."""
    import testbed.sim.planning as planning

    inputs = load_inputs(ROOT / "topologies" / "two-dc.yaml")
    with keeping_answers():
        first = plan_with_simulator(training_policy("atlas"), inputs.topology, inputs.job, {})
    assert first.notes["planning_kept"] is False

    def no_simulation(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("simulated again")

    with monkeypatch.context() as patched, keeping_answers():
        patched.setattr(planning, "simulated_iteration_s", no_simulation)
        again = plan_with_simulator(training_policy("atlas"), inputs.topology, inputs.job, {})
        ablation = plan_with_simulator(training_policy("atlas-no-temporal"),
                                       inputs.topology, inputs.job, {})
        serving = load_inputs(ROOT / "topologies" / "two-dc.yaml",
                              sets=("inference.arrival_rate=100/s", "iterations=7"))
        longer = plan_with_simulator(training_policy("atlas"), serving.topology,
                                     serving.job, {})
    assert longer.notes["planning_kept"] is True and longer.programs == first.programs
    assert again.notes["planning_kept"] is True
    assert ablation.placement == first.placement
    drop = {"planning_s", "planning_kept"}
    assert {k: v for k, v in again.notes.items() if k not in drop} == \
        {k: v for k, v in first.notes.items() if k not in drop}
    assert again.programs == first.programs and again.placement == first.placement
    with keeping_answers():
        other = plan_with_simulator(training_policy("atlas", {"temporal": "off"}),
                                    inputs.topology, inputs.job, {})
    assert other.notes["planning_kept"] is False
    # outside `keeping_answers` (the API's default), nothing is read back
    assert plan_with_simulator(training_policy("atlas"), inputs.topology, inputs.job,
                               {}).notes["planning_kept"] is False


def test_a_command_run_again_writes_the_same_results(kept: Path, tmp_path: Path) -> None:
    testbed = Path(sys.executable).parent / "testbed"
    runs = []
    for name in ("first", "again"):
        subprocess.run([str(testbed), "simulate", str(ROOT / "topologies" / "two-dc.yaml"),
                        "-p", "atlas", "--out", str(tmp_path / name)], check=True,
                       capture_output=True, env=os.environ.copy())
        runs.append(json.loads((tmp_path / name / "results.json").read_text()))
    first, again = runs
    assert (first["plan"]["notes"]["planning_kept"], again["plan"]["notes"]["planning_kept"]) \
        == (False, True)
    for run in runs:
        run.pop("wall_s", None)
        for key in ("planning_s", "planning_kept"):
            run["plan"]["notes"].pop(key)
    assert first == again
    assert (kept / "answers.sqlite").exists()


def test_a_command_whose_store_cannot_be_written_says_so_in_one_line_and_runs(
        tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    done = subprocess.run(
        [str(Path(sys.executable).parent / "testbed"), "plan",
         str(ROOT / "topologies" / "two-dc.yaml"), "-p", "atlas"], capture_output=True,
        text=True, env={**os.environ, "TESTBED_CACHE": "on",
                        "TESTBED_CACHE_DIR": str(blocked / "cache")})
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"testbed: warning: {blocked / 'cache' / 'answers.sqlite'}: not keeping planning "
        f"answers ([Errno 20] Not a directory: '{blocked / 'cache'}'); set TESTBED_CACHE=off "
        "to silence this"]


def test_a_sweeps_workers_keep_their_searches_as_its_own_process_would(
        kept: Path, tmp_path: Path) -> None:
    """Points run in spawned workers keep answers in the user's store, as the sweep's
    process does: arrival rates are one search (the job as Atlas simulates it), kept once
    by whichever worker made it."""
    import sqlite3

    done = subprocess.run(
        [str(Path(sys.executable).parent / "testbed"), "sweep",
         str(ROOT / "topologies" / "two-dc.yaml"), "-p", "atlas",
         "--vary", "inference.arrival_rate=50/s,100/s", "--workers", "2",
         "--out", str(tmp_path / "sweep")], capture_output=True, text=True,
        env=os.environ.copy(), check=False)
    assert done.returncode == 0, done.stderr
    with contextlib.closing(sqlite3.connect(kept / "answers.sqlite")) as store:
        keys = [row[0] for row in store.execute("SELECT key FROM answers")]
    assert len(keys) == 1
