"""results.json's contract: the types of testbed.report.run_results, the JSON Schema
shipped beside them (the two cannot drift), every kind of run's results.json validating
against it, and a damaged one refused in one line naming the file and the key."""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from testbed.common.codec import Open, from_json, to_json
from testbed.report.results_schema import (
    results_from,
    results_schema,
    schema_text,
    shipped_schema,
)
from testbed.report.run_results import (
    SCHEMA_VERSION,
    EmulatorBlock,
    RecoveryBlock,
    Results,
    SimulatorBlock,
)
from testbed.scenario.reach import Applied
from tests.conftest import ROOT, TOPOLOGIES
from tests.test_cli import call

pytestmark = pytest.mark.usefixtures("shared_planning")

PAPER = str(TOPOLOGIES / "paper-3dc.yaml")
TWO_DC = str(TOPOLOGIES / "two-dc.yaml")


def test_the_shipped_schema_is_the_one_the_types_make() -> None:
    """results.schema.json is `python -m testbed.report.results_schema`'s output: a
    change to the types without regenerating it fails here."""
    shipped = (ROOT / "testbed" / "report" / "results.schema.json").read_text()
    assert shipped == schema_text()
    assert shipped_schema() == results_schema()
    assert shipped_schema()["schema_version"] == SCHEMA_VERSION


@pytest.mark.parametrize("block", [SimulatorBlock, EmulatorBlock, RecoveryBlock, Applied])
def test_each_block_a_backend_hands_back_is_typed_as_results_types_it(block: type) -> None:
    """The blocks a run's parts hand the writer (the backends', recovery's, which events
    the run reached) name Results' fields and their types: one contract, not a second
    copy that could drift (OPEN, a mark for the schema alone, aside)."""
    def unmarked(hint: Any) -> Any:
        origin, args = typing.get_origin(hint), typing.get_args(hint)
        if origin is typing.Annotated and any(isinstance(a, Open) for a in args[1:]):
            return unmarked(args[0])
        if origin in (typing.Union, types.UnionType):
            return typing.Union[tuple(unmarked(a) for a in args)]  # noqa: UP007
        return list[unmarked(args[0])] if origin is list else hint

    def members(hint: object) -> set[object]:
        hint = unmarked(hint)
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        return set(typing.get_args(hint)) if union else {hint}

    results = typing.get_type_hints(Results, include_extras=True)
    for name, hint in typing.get_type_hints(block, include_extras=True).items():
        assert name in results, name
        assert members(hint) <= members(results[name]), (name, hint, results[name])


def test_the_shipped_schema_is_a_valid_json_schema_for_stock_validators(
        tmp_path: Path) -> None:
    """Its `$id` once ended in `#2`, a fragment draft 2020-12's metaschema forbids: stock
    validators refused the schema before reading a result. The version is in its path."""
    schema = shipped_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$id"] == f"testbed:results/{SCHEMA_VERSION}.schema.json"
    _, data = _simulated(tmp_path, TWO_DC, "-p", "1f1b")
    jsonschema.validate(data, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**data, "surprise": 1}, schema)


def _simulated(tmp: Path, *args: str) -> tuple[Path, dict[str, Any]]:
    out = tmp / "run"
    code, _, err = call(["simulate", *args, "--out", str(out)])
    assert code == 0, err
    return out, json.loads((out / "results.json").read_text())


def _valid(path: Path) -> str:
    code, out, err = call(["results", "validate", str(path)])
    assert code == 0, err
    return out


@pytest.mark.parametrize(("args", "block"), [
    pytest.param([TWO_DC, "-p", "1f1b"], "loss_note", id="plain"),
    pytest.param([PAPER, "-p", "atlas", "-b", "bubbletea", "--iterations", "3",
                  "--jitter", "compute=10%,prefill=10%"], "jitter", id="bubbles-jitter"),
    pytest.param([TWO_DC, "-p", "1f1b", "--iterations", "150", "--scenario",
                  str(ROOT / "scenarios" / "two-dc-lose-a-worker.yaml"),
                  "--on-failure", "replan", "--checkpoint-every", "5"], "failures",
                 id="failures"),
])
def test_a_simulated_runs_results_validate_and_read_back_typed(
        tmp_path: Path, args: list[str], block: str) -> None:
    """Each kind of run fills the blocks it has (`block`: one that only it fills)."""
    directory, data = _simulated(tmp_path, *args)
    assert data[block]
    if "-b" in args:
        assert data["inference"]["requests"] and data["inference"]["overruns"]
    assert data["schema_version"] == SCHEMA_VERSION
    assert "ok: 1 results.json" in _valid(directory)
    typed = results_from(data, "results.json")
    assert isinstance(typed, Results)
    assert typed.iteration_time_s.all == data["iteration_time_s"]["all"]
    assert typed.inference.requests == data["inference"]["requests"]
    assert to_json(typed) == data  # nothing lost or added on the way


def test_compares_runs_validate(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    code, _, err = call(["compare", TWO_DC, "-p", "1f1b", "-p", "gpipe", "--iterations", "2",
                         "--out", str(out)])
    assert code == 0, err
    assert "ok: 2 results.json" in _valid(out)


def _damaged(tmp: Path, change: Any) -> Path:
    _, data = _simulated(tmp, TWO_DC, "-p", "1f1b")
    change(data)
    path = tmp / "results.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(("change", "key", "problem"), [
    (lambda d: d["iteration_time_s"].update(median="fast"), "iteration_time_s.median",
     "expected number or null, got text 'fast'"),
    (lambda d: d["inference"]["ttft_s"].pop("p99"), "inference.ttft_s.p99", "missing"),
    (lambda d: d["loss_model"].pop("band"), "loss_model.band", "missing"),  # X or null
    (lambda d: d.update(status="great"), "status", "expected one of"),
    (lambda d: d.update(surprise=1), "surprise", "unknown key"),
    (lambda d: d.update(loss_curve=[{"iteration": 1, "time_s": 0.5, "tokens": 8}]),
     "loss_curve[0].loss", "missing"),
    (lambda d: d.update(tokens_per_s=True), "tokens_per_s", "got bool True"),
    (lambda d: d.update(schema_version=1), "schema_version", "another version"),
    (lambda d: d.pop("schema_version"), "schema_version", "before testbed's results had"),
    (lambda d: d["loss_model"]["target"].update(time_band_s=[1.0]),
     "loss_model.target.time_band_s", "too short"),
])
def test_a_damaged_results_json_is_refused_naming_the_key(
        tmp_path: Path, change: Any, key: str, problem: str) -> None:
    path = _damaged(tmp_path, change)
    code, _, err = call(["results", "validate", str(path)])
    assert code == 2
    assert err.count("\n") == 1, err
    assert f"{path}: {key}" in err and problem in err, err


def test_validate_reports_every_problem_in_every_file(tmp_path: Path) -> None:
    """It stopped at the first: a file broken in three places took three runs to mend."""
    _, data = _simulated(tmp_path, TWO_DC, "-p", "1f1b")
    broken = json.loads(json.dumps(data))
    broken["iteration_time_s"]["median"] = "fast"
    broken["inference"]["ttft_s"].pop("p99")
    broken.update(surprise=1, also=2, loss_curve=[{"iteration": 1}, {"iteration": "2"}])
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text(json.dumps(broken))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "results.json").write_text(json.dumps({**data, "status": "great"}))
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "results.json").write_text(json.dumps(data))
    code, out, err = call(["results", "validate", str(tmp_path / "a"), str(tmp_path / "b"),
                           str(tmp_path / "c")])
    assert code == 2
    a, b = tmp_path / "a" / "results.json", tmp_path / "b" / "results.json"
    assert sorted(err.splitlines()) == sorted([
        f"testbed: error: {a}: iteration_time_s.median: expected number or null, got text "
        "'fast'",
        f"testbed: error: {a}: inference.ttft_s.p99: missing",
        f"testbed: error: {a}: surprise: unknown key (not in schema_version {SCHEMA_VERSION})",
        f"testbed: error: {a}: also: unknown key (not in schema_version {SCHEMA_VERSION})",
        *(f"testbed: error: {a}: loss_curve[{i}].{key}: missing"
          for i in (0, 1) for key in ("time_s", "tokens", "loss")),
        f"testbed: error: {a}: loss_curve[1].iteration: expected integer, got text '2'",
        f"testbed: error: {b}: status: expected one of \"ok\", \"failed\", "
        "\"interrupted\", got text 'great'",
    ])
    assert out == f"{tmp_path / 'c'}: ok: 1 results.json, schema_version {SCHEMA_VERSION}\n"


def test_validate_caps_what_it_prints_and_says_how_many_more(tmp_path: Path) -> None:
    _, data = _simulated(tmp_path, TWO_DC, "-p", "1f1b")
    path = tmp_path / "results.json"
    path.write_text(json.dumps({**data, **{f"extra{i}": i for i in range(25)}}))
    code, _, err = call(["results", "validate", str(path)])
    lines = err.splitlines()
    assert code == 2 and len(lines) == 21
    assert all(f"{path}: extra" in line for line in lines[:20])
    assert lines[20] == "testbed: error: 5 more problems not shown (25 in all)"


def test_validate_says_what_it_did_not_find(tmp_path: Path) -> None:
    code, _, err = call(["results", "validate", str(tmp_path)])
    assert code == 2 and "no results.json" in err and str(tmp_path) in err


def test_from_json_refuses_a_key_the_types_do_not_have() -> None:
    """The writer builds results.json through the types: a key a backend adds without
    adding it to them fails the run's writing, before the file exists."""
    with pytest.raises(ValueError, match="no surprise"):
        from_json({"surprise": 1}, Results, "results")


def test_the_printed_schema_is_the_shipped_one() -> None:
    code, out, _ = call(["results", "schema"])
    assert code == 0
    assert json.loads(out) == shipped_schema()
