"""Fuzzed input files through the CLI: one-line errors with exit code 2, never a traceback,
nothing left behind. The `ci` profile runs a few hundred cases per kind; scripts/soak.py
runs thousands."""

from __future__ import annotations

import atexit
import csv
import functools
import io
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.cli.main import main
from testbed.common.yamlio import read_yaml

from .fuzzing import cli_rejects_cleanly_or_accepts, mutated_data, mutated_text, write
from .test_cli import call

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGIES = ROOT / "topologies"
EVENTS = [{"at": "5s", "link": ["east", "west"], "down": "2s"},
          {"at": "1s", "link": "east-west", "latency": "80ms", "for": "3s"}]


def _try(name: str, content: Any, argv: Callable[[str], list[str]]) -> None:
    """Write `content` as file `name` in a fresh folder and run the CLI on it."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        write(path, content)
        cli_rejects_cleanly_or_accepts(argv(str(path)), name, Path(tmp))


def _base_topology(name: str) -> dict[str, Any]:
    data = read_yaml(TOPOLOGIES / f"{name}.yaml")
    assert isinstance(data, dict)
    if name == "two-dc":
        data["events"] = EVENTS
    return data


@given(st.sampled_from(["two-dc", "paper-3dc"]).flatmap(
    lambda n: mutated_data(_base_topology(n))))
def test_fuzzed_topology_data(data: Any) -> None:
    _try("topo.yaml", data, lambda path: ["validate", path])


@given(st.sampled_from(["two-dc.yaml", "paper-3dc.yaml", "gpt3-4dc.yaml"]).flatmap(
    lambda n: mutated_text((TOPOLOGIES / n).read_text())))
def test_fuzzed_topology_text(text: str) -> None:
    _try("topo.yaml", text, lambda path: ["validate", path])


@given(mutated_data({"job": _base_topology("paper-3dc")["job"]}))
def test_fuzzed_job_file(data: Any) -> None:
    _try("job.yaml", data,
         lambda path: ["validate", str(TOPOLOGIES / "paper-3dc.yaml"), "--job", path])


@functools.cache
def _plan_csv() -> str:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.csv"
        _quiet(["plan", str(TOPOLOGIES / "two-dc.yaml"), "-p", "1f1b", "--csv", str(path)])
        return path.read_text()


def _quiet(argv: list[str]) -> None:
    import contextlib

    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            main(argv)
        except SystemExit as exc:
            assert not exc.code, argv


def _csv_rows() -> list[list[str]]:
    return list(csv.reader(io.StringIO(_plan_csv())))


@given(st.one_of(st.just(None).flatmap(lambda _: mutated_data(_csv_rows())),
                 st.just(None).flatmap(lambda _: mutated_text(_plan_csv()))))
def test_fuzzed_plan_csv(mutated: Any) -> None:
    if not isinstance(mutated, str):
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        for row in mutated if isinstance(mutated, list) else [[mutated]]:
            writer.writerow(row if isinstance(row, list) else [row])
        mutated = out.getvalue()
    _try("plan.csv", mutated,
         lambda path: ["plan", str(TOPOLOGIES / "two-dc.yaml"), "--load", path])


@functools.cache
def _compare_dir() -> Path:
    out = Path(tempfile.mkdtemp(prefix="fuzz-compare-"))
    atexit.register(shutil.rmtree, out, True)
    _quiet(["compare", str(TOPOLOGIES / "two-dc.yaml"), "-p", "gpipe", "-p", "1f1b",
            "--backend", "simulate", "--iterations", "2", "--out", str(out / "c")])
    return out / "c"


def _results_files() -> list[str]:
    base = _compare_dir()
    return sorted(str(p.relative_to(base)) for p in base.rglob("*.json"))


@given(st.data())
def test_fuzzed_results_files(data: st.DataObject) -> None:
    base = _compare_dir()
    name = data.draw(st.sampled_from(_results_files()))
    import json

    original = json.loads((base / name).read_text())
    mutated = data.draw(st.one_of(mutated_data(original),
                                  mutated_text((base / name).read_text())))
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "c"
        shutil.copytree(base, copy)
        write(copy / name, mutated, as_json=True)
        cli_rejects_cleanly_or_accepts(["report", str(copy), "--no-plots"], Path(name).name,
                                       copy)


@settings(max_examples=max(10, settings.default.max_examples // 13))  # plotting is slow
@given(st.data())
def test_fuzzed_results_files_that_pass_the_checks_still_plot(data: st.DataObject) -> None:
    base = _compare_dir()
    name = data.draw(st.sampled_from([n for n in _results_files() if "spans" in n]))
    import json

    mutated = data.draw(mutated_data(json.loads((base / name).read_text())))
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "c"
        shutil.copytree(base, copy)
        write(copy / name, mutated, as_json=True)
        cli_rejects_cleanly_or_accepts(["report", str(copy)], Path(name).name, copy)


@pytest.mark.parametrize("loss_model", ["garbage", {"target": {"time_band_s": [1.0]}}, {}])
def test_a_results_file_without_a_schema_is_read_without_its_loss_model(
        tmp_path: Path, loss_model: object) -> None:
    """A file written before results had a schema never held a loss model (it came
    later): what stands under that key there is unchecked, so the report leaves it out."""
    import json

    copy = tmp_path / "c"
    shutil.copytree(_compare_dir(), copy)
    results = next(copy.rglob("results.json"))
    data = json.loads(results.read_text())
    del data["schema_version"]
    data["loss_model"] = loss_model
    results.write_text(json.dumps(data))
    code, _, err = call(["report", str(copy), "--no-plots"])
    assert code == 0, err
