"""Planning answers kept across commands: read back only for the same key on the same
code, the same plan and results as a fresh search; data, never code, believed only from
a store no one else could have written and only where it checks out; a store that cannot
be written or trusted costs nothing but the saving."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import pickle
import pwd
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from testbed import errors
from testbed.common.memo import FILE, KEY_FILE, DiskMemo, NoMemo, code_version, user_memo
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import keeping_answers, plan_with_simulator
from testbed.plan.build import Schedule
from testbed.plan.model import Plan
from testbed.policy import training_policy

ROOT = Path(__file__).resolve().parent.parent
TWO_DC = ROOT / "topologies" / "two-dc.yaml"


@pytest.fixture
def kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The store on, in a folder of this test's own."""
    monkeypatch.setenv("TESTBED_PLANNING_STORE", "on")
    monkeypatch.setenv("TESTBED_PLANNING_STORE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


@dataclass(frozen=True)
class Answer:
    seconds: float
    names: tuple[str, ...]
    schedule: Schedule
    note: str | None = None


@dataclass(frozen=True)
class Word:
    text: str


def _plan(policy: str = "atlas") -> Plan:
    """Atlas's plan of two-dc, as a command makes it (keeping answers)."""
    inputs = load_inputs(TWO_DC)
    with keeping_answers():
        return plan_with_simulator(training_policy(policy), inputs.topology, inputs.job, {})


def _same_plan(a: Plan, b: Plan) -> bool:
    drop = {"planning_s", "planning_kept"}
    return a.programs == b.programs and a.placement == b.placement and \
        {k: v for k, v in a.notes.items() if k not in drop} == \
        {k: v for k, v in b.notes.items() if k not in drop}


def test_an_answer_is_read_back_only_for_its_key_and_its_code(tmp_path: Path) -> None:
    memo = DiskMemo(tmp_path / "a.sqlite", "v1")
    answer = Answer(1.5, ("east", "west"), Schedule.GPIPE)
    assert memo.get(("k", 1), Answer) is None
    memo.put(("k", 1), answer)
    assert memo.get(("k", 1), Answer) == answer
    assert memo.get(("k", 2), Answer) is None
    assert memo.get(("k", 1), Word) is None  # another class
    assert DiskMemo(tmp_path / "a.sqlite", "v2").get(("k", 1), Answer) is None  # other code
    assert DiskMemo(tmp_path / "a.sqlite", "v1").get(("k", 1), Answer) == answer
    assert memo.get(("k", 1), Answer, lambda a: a.seconds > 2) is None  # the reader's check
    with pytest.raises(TypeError, match="a kept answer is a dataclass"):
        memo.put("k", (1.5, [2, "x"]))


def test_a_store_keeps_its_newest_answers(tmp_path: Path) -> None:
    """The oldest written go first; one written again is new."""
    store = DiskMemo(tmp_path / "answers.sqlite", "v1", keep=3)
    for key in ("a", "b", "c"):
        store.put(key, Word(key.upper()))
    store.put("a", Word("A again"))
    store.put("d", Word("D"))
    assert [store.get(key, Word) for key in "abcd"] == \
        [Word("A again"), None, Word("C"), Word("D")]


def test_a_store_that_cannot_be_written_warns_once_and_keeps_nothing(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("")
    memo = DiskMemo(blocked / "a.sqlite", "v1")  # its folder is a file
    with pytest.warns(UserWarning, match="not keeping planning answers") as caught:
        memo.put("k", Word("a"))
        assert memo.get("k", Word) is None
    assert len(caught) == 1


def test_a_store_is_made_private(tmp_path: Path) -> None:
    """Its folder 0700, the file and its key 0600."""
    DiskMemo(tmp_path / "new" / FILE, "v1").put("k", Word("a"))
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "new").iterdir()}
    assert modes == {FILE: 0o600, KEY_FILE: 0o600}
    assert (tmp_path / "new").stat().st_mode & 0o777 == 0o700


def test_the_store_is_off_where_the_user_says_so(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    """`TESTBED_PLANNING_STORE=off`; the older `TESTBED_CACHE` is read for `off` alone
    (it named the capacity cache's folder too), and never as a folder."""
    for name in ("TESTBED_PLANNING_STORE", "TESTBED_PLANNING_STORE_DIR", "TESTBED_CACHE",
                 "TESTBED_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TESTBED_PLANNING_STORE", "off")
    assert isinstance(user_memo(["testbed"]), NoMemo)
    monkeypatch.delenv("TESTBED_PLANNING_STORE")
    monkeypatch.setenv("TESTBED_CACHE", "off")
    assert isinstance(user_memo(["testbed"]), NoMemo)
    monkeypatch.setenv("TESTBED_PLANNING_STORE", "on")  # the new name wins
    assert isinstance(user_memo(["testbed"]), DiskMemo)
    monkeypatch.delenv("TESTBED_PLANNING_STORE")
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "capacity"))
    monkeypatch.setenv("TESTBED_PLANNING_STORE_DIR", str(tmp_path))
    memo = user_memo(["testbed"])
    assert isinstance(memo, DiskMemo) and memo.path.parent == tmp_path
    monkeypatch.delenv("TESTBED_PLANNING_STORE_DIR")
    monkeypatch.setenv("TESTBED_CACHE_DIR", str(tmp_path / "older"))
    memo = user_memo(["testbed"])
    assert isinstance(memo, DiskMemo) and memo.path.parent == tmp_path / "older"
    monkeypatch.delenv("TESTBED_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    memo = user_memo(["testbed"])
    assert isinstance(memo, DiskMemo) and memo.path.parent == tmp_path / "xdg" / "testbed"


class _RunsCode:
    """A pickle that, loaded, makes a folder: what a row someone rewrote could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.mkdir, (str(self.marker),))


def test_a_row_rewritten_to_run_code_runs_nothing_and_is_a_miss(kept: Path,
                                                                tmp_path: Path) -> None:
    """Every row's value replaced by a pickle whose loading would run code: no code
    runs, the search runs again and makes the same plan, and keeps its answer again."""
    first = _plan()
    marker = tmp_path / "code-ran"
    with contextlib.closing(sqlite3.connect(kept / FILE)) as store, store:
        tables = [name for (name,) in
                  store.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        for table in tables:
            store.execute(f"UPDATE {table} SET value = ?", (pickle.dumps(_RunsCode(marker)),))
    assert tables
    again = _plan()
    assert not marker.exists()
    assert again.notes["planning_kept"] is False and _same_plan(again, first)
    assert _plan().notes["planning_kept"] is True


@pytest.mark.parametrize("claims", ["its own time", "the fastest time"])
def test_a_plausible_wrong_answer_is_not_used(kept: Path, monkeypatch: pytest.MonkeyPatch,
                                              claims: str) -> None:
    """Atlas's slowest measured candidate kept as its choice, written through the store
    itself (as other code, or a writer with the store's key, could): with its own time it
    is not the fastest of those it lists; claiming the fastest one's, its re-simulation
    says otherwise. Either way the next plan searches again and makes the right plan."""
    from testbed_plugins.atlas.policy import AtlasPolicy

    inputs = load_inputs(TWO_DC)
    right = plan_with_simulator(training_policy("atlas"), inputs.topology, inputs.job, {})
    choose = AtlasPolicy.choose

    def slowest_first(self: AtlasPolicy, *args: Any) -> Any:
        chosen, considered, why = choose(self, *args)
        slowest = considered[-1]
        if claims == "the fastest time":
            slowest = replace(slowest, simulated_s=chosen.simulated_s, at_least=False)
        return slowest, [slowest, *considered[:-1]], why

    with monkeypatch.context() as patched:
        patched.setattr(AtlasPolicy, "choose", slowest_first)
        wrong = _plan()
    assert wrong.notes["dc_selection"]["chosen"] != right.notes["dc_selection"]["chosen"]
    again = _plan()
    assert again.notes["planning_kept"] is False and _same_plan(again, right)
    assert _plan().notes["planning_kept"] is True


@dataclass(frozen=True)
class _NotAChoice:
    chosen: str
    considered: list[str]
    why: int


def test_a_value_of_the_wrong_shape_is_a_miss_and_later_runs_work(
        kept: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another answer kept under Atlas's key: the next plan searches again (no error
    blaming the policy), and the one after reads its own answer back."""
    writes: list[tuple[DiskMemo, Any]] = []
    put = DiskMemo.put

    def recorded(self: DiskMemo, key: Any, value: Any) -> None:
        writes.append((self, key))
        put(self, key, value)

    with monkeypatch.context() as patched:
        patched.setattr(DiskMemo, "put", recorded)
        first = _plan()
    (store, key), = writes
    put(store, key, _NotAChoice("east", ["west"], 3))
    again = _plan()
    assert again.notes["planning_kept"] is False and _same_plan(again, first)
    assert _plan().notes["planning_kept"] is True


def test_an_answer_of_another_shape_under_its_class_name_is_a_miss(tmp_path: Path) -> None:
    """A class whose fields changed (the code's version is in the key, so this takes a
    store shared across versions that kept the same digest: a miss, not an error)."""
    old = dataclasses.make_dataclass("Shape", [("a", int)])
    new = dataclasses.make_dataclass("Shape", [("b", str)])
    memo = DiskMemo(tmp_path / FILE, "v1")
    memo.put("k", old(1))
    assert memo.get("k", old) == old(1)
    assert memo.get("k", new) is None
    memo.put("k", new("x"))
    assert memo.get("k", new) == new("x")


def test_a_row_changed_outside_the_store_is_a_miss(tmp_path: Path) -> None:
    """Rows signed with the store's key: two rows' answers swapped are misses, and a
    store file copied beside another key reads nothing."""
    memo = DiskMemo(tmp_path / "a" / FILE, "v1")
    memo.put("one", Word("1"))
    memo.put("two", Word("2"))
    with contextlib.closing(sqlite3.connect(tmp_path / "a" / FILE)) as store, store:
        rows = dict(store.execute("SELECT key, value FROM kept"))
        (a, b) = rows
        store.execute("UPDATE kept SET value = ? WHERE key = ?", (rows[b], a))
        store.execute("UPDATE kept SET value = ? WHERE key = ?", (rows[a], b))
    assert memo.get("one", Word) is None and memo.get("two", Word) is None
    memo.put("one", Word("1"))
    (tmp_path / "b").mkdir(mode=0o700)
    (tmp_path / "b" / FILE).write_bytes((tmp_path / "a" / FILE).read_bytes())
    assert DiskMemo(tmp_path / "b" / FILE, "v1").get("one", Word) is None
    assert memo.get("one", Word) == Word("1")


def _nobody() -> int:
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    return pwd.getpwnam("nobody").pw_uid


@pytest.mark.parametrize("change", ["its owner", "its mode", "its folder's mode"])
def test_a_store_others_could_write_is_not_trusted(kept: Path, change: str) -> None:
    """A store given to another user, or writable by all, is treated as absent: one
    warning, and the answer is computed (the same plan), not read."""
    first = _plan()
    store = kept / FILE
    if change == "its owner":
        os.chown(store, _nobody(), -1)
    elif change == "its mode":
        store.chmod(0o666)
    else:
        kept.chmod(0o777)
    with pytest.warns(errors.TestbedWarning,
                      match="not keeping planning answers .not trusted: ") as caught:
        again = _plan()
    assert len(caught) == 1
    assert again.notes["planning_kept"] is False and _same_plan(again, first)


@pytest.mark.parametrize("change", ["folder owned by another", "folder above writable",
                                    "key readable", "key a link", "file a link"])
def test_a_store_is_believed_only_where_no_one_else_could_write_it(tmp_path: Path,
                                                                   change: str) -> None:
    folder = tmp_path / "store"
    DiskMemo(folder / FILE, "v1").put("k", Word("a"))
    if change == "folder owned by another":
        os.chown(folder, _nobody(), -1)
    elif change == "folder above writable":
        tmp_path.chmod(0o777)
    elif change == "key readable":
        (folder / KEY_FILE).chmod(0o644)
    elif change == "key a link":
        (folder / KEY_FILE).rename(tmp_path / "key")
        (folder / KEY_FILE).symlink_to(tmp_path / "key")
    else:
        (folder / FILE).rename(tmp_path / "elsewhere")
        (folder / FILE).symlink_to(tmp_path / "elsewhere")
    memo = DiskMemo(folder / FILE, "v1")
    with pytest.warns(errors.TestbedWarning, match="not trusted") as caught:
        assert memo.get("k", Word) is None
        memo.put("k", Word("b"))
        assert memo.get("k", Word) is None
    assert len(caught) == 1


def test_a_linked_store_is_refused_and_left_as_it_was(kept: Path, tmp_path: Path) -> None:
    """A store that is a link (here to an empty file) is neither read nor made a SQLite
    file: the answer is computed."""
    kept.mkdir(mode=0o700)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    (kept / FILE).symlink_to(empty)
    with pytest.warns(errors.TestbedWarning, match="is a symbolic link"):
        first = _plan()
        again = _plan()
    assert empty.read_bytes() == b""
    assert again.notes["planning_kept"] is False and _same_plan(again, first)


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
    """A second plan of the same inputs runs one simulation (its kept choice's, to check
    it) and makes the same plan, with the same candidates and reasons, and so does one of
    a longer run with requests to serve (the search simulates a few iterations of training
    alone); other inputs search again."""
    import testbed.experiments.planning as planning

    inputs = load_inputs(ROOT / "topologies" / "two-dc.yaml")
    with keeping_answers():
        first = plan_with_simulator(training_policy("atlas"), inputs.topology, inputs.job, {})
    assert first.notes["planning_kept"] is False
    simulate = planning.simulated_iteration_s
    simulated: list[object] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        simulated.append(args)
        return simulate(*args, **kwargs)

    def plans_simulating_once(*args: Any) -> Plan:
        """A plan whose kept answer is checked by re-simulating its choice, and no more."""
        simulated.clear()
        plan = plan_with_simulator(*args)
        assert len(simulated) == 1
        return plan

    with monkeypatch.context() as patched, keeping_answers():
        patched.setattr(planning, "simulated_iteration_s", counted)
        again = plans_simulating_once(training_policy("atlas"), inputs.topology, inputs.job, {})
        ablation = plans_simulating_once(training_policy("atlas-no-temporal"),
                                         inputs.topology, inputs.job, {})
        serving = load_inputs(ROOT / "topologies" / "two-dc.yaml",
                              sets=("inference.arrival_rate=100/s", "iterations=7"))
        longer = plans_simulating_once(training_policy("atlas"), serving.topology,
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
        text=True, env={**os.environ, "TESTBED_PLANNING_STORE": "on",
                        "TESTBED_PLANNING_STORE_DIR": str(blocked / "cache")})
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        f"testbed: warning: {blocked / 'cache' / 'answers.sqlite'}: not keeping planning "
        f"answers ([Errno 20] Not a directory: '{blocked / 'cache'}'); set "
        "TESTBED_PLANNING_STORE=off to silence this"]


def test_a_sweeps_workers_keep_their_searches_as_its_own_process_would(
        kept: Path, tmp_path: Path) -> None:
    """Points run in spawned workers keep answers in the user's store, as the sweep's
    process does: arrival rates are one search (the job as Atlas simulates it), kept once
    by whichever worker made it."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "testbed"), "sweep",
         str(ROOT / "topologies" / "two-dc.yaml"), "-p", "atlas",
         "--vary", "inference.arrival_rate=50/s,100/s", "--workers", "2",
         "--out", str(tmp_path / "sweep")], capture_output=True, text=True,
        env=os.environ.copy(), check=False)
    assert done.returncode == 0, done.stderr
    with contextlib.closing(sqlite3.connect(kept / FILE)) as store:
        keys = [row[0] for row in store.execute("SELECT key FROM kept")]
    assert len(keys) == 1
