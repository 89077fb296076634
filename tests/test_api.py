"""The Python API gives what the commands give: the same plan, files and figures."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from testbed import api
from testbed.errors import InputError

from .conftest import TOPOLOGIES

pytestmark = pytest.mark.usefixtures("shared_planning")

TWO_DC = TOPOLOGIES / "two-dc.yaml"

ROOT = Path(__file__).resolve().parent.parent


def test_compare_writes_each_run_and_returns_typed_results(tmp_path: Path) -> None:
    inputs = api.load(TOPOLOGIES / "two-dc.yaml", iterations=3, sets={"model.layers": 6})
    assert inputs.job.iterations == 3 and inputs.job.model.layers == 6
    runs = api.compare(inputs, ["gpipe", "1f1b"], out=tmp_path)
    for name, result in runs.items():
        written = json.loads((result.directory / "results.json").read_text())
        assert result.directory == tmp_path / "runs" / f"{name}-r1"
        assert written == result.results
        assert result.iteration_s == written["iteration_time_s"]["median"] > 0
        assert result.record.plan.policy == name and result.error is None


def test_plan_and_simulate_match_the_commands(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from testbed.cli.main import cli

    inputs = api.load(TOPOLOGIES / "two-dc.yaml")
    result = api.simulate(inputs, "gpipe", out=tmp_path / "api")
    runner = CliRunner()
    done = runner.invoke(cli, ["simulate", str(TOPOLOGIES / "two-dc.yaml"), "-p", "gpipe",
                               "--out", str(tmp_path / "cli")])
    assert done.exit_code == 0, done.output
    by_cli = json.loads((tmp_path / "cli" / "results.json").read_text())
    assert by_cli["iteration_time_s"] == result.results["iteration_time_s"]
    assert api.plan(inputs, "gpipe") == result.record.plan


def test_bad_input_is_the_commands_error() -> None:
    with pytest.raises(InputError, match="iterations"):
        api.load(TOPOLOGIES / "two-dc.yaml", iterations=0)


@pytest.mark.parametrize(("call", "expected"), [
    (lambda: api.load(TWO_DC, sets=["model.layers=8"]),
     "sets: expected a mapping like {'model.layers': 8}, got list ['model.layers=8']"),
    (lambda: api.load(TWO_DC, sets="model.layers=8"),
     "sets: expected a mapping like {'model.layers': 8}, got str 'model.layers=8'"),
    (lambda: api.load(TWO_DC, events="at=1s,link=east-west,down=5s"),
     "events: expected a list of texts like ['at=30s,link=east-west,down=5s'], got str "
     "'at=1s,link=east-west,down=5s'"),
    (lambda: api.plan(api.load(TWO_DC), "gpipe", options=["sends=eager"]),
     "options: expected a mapping like {'connections': '8'}, got list ['sends=eager']"),
    (lambda: api.compare(api.load(TWO_DC), "gpipe"),
     "policies: expected a list of texts like ['gpipe', 'atlas'], got str 'gpipe'"),
])
def test_an_argument_of_the_wrong_type_is_one_line_naming_it(call: Any, expected: str) -> None:
    """`sets=[...]` raised AttributeError: 'list' object has no attribute 'items'."""
    with pytest.raises(InputError) as info:
        call()
    assert str(info.value) == expected


def test_the_documentations_script_runs(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    page = (ROOT / "docs" / "api.md").read_text()
    script = re.search(r"```python\n(.*?)```", page, re.S)
    assert script, "docs/api.md shows a script using testbed.api"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "topologies").symlink_to(ROOT / "topologies")
    exec(compile(script.group(1), "docs/api.md", "exec"), {})
    assert any((tmp_path / "runs").iterdir())


SMALL = {"model.layers": 6, "model.hidden": 1024, "model.heads": 8,
         "inference.arrival_rate": "50/s"}


def test_compare_takes_options_bubbles_repeats_and_jitter_as_the_command_does(
        tmp_path: Path) -> None:
    from .test_cli import call

    inputs = api.load(TOPOLOGIES / "paper-3dc.yaml", iterations=3, microbatches=4, sets=SMALL)
    runs = api.compare(inputs, ["gpipe", "1f1b"], options={"1f1b.sends": "eager"},
                       bubbles=["none", "greedy"], repeat=2, jitter="10%", out=tmp_path / "api")
    assert list(runs) == ["gpipe+none", "gpipe+greedy", "1f1b+none", "1f1b+greedy"]
    assert all(len(runs.repeats[combo]) == 2 for combo in runs)
    assert runs["1f1b+none"].results["policy_options"] == {"sends": "eager"}
    assert runs["gpipe+none"].results["policy_options"] == {}
    assert runs["1f1b+greedy"].results["inference"]["served"] > 0
    first, second = runs.repeats["gpipe+none"]
    assert first.results["jitter"]["seed"] == 0 and second.results["jitter"]["seed"] == 1
    assert first.iteration_s != second.iteration_s
    [greedy] = [row for row in runs.rows if row.combo == "1f1b+greedy"]
    assert greedy.runs == 2 and greedy.slowdown_interval is not None
    sets = [arg for key, value in SMALL.items() for arg in ("--set", f"{key}={value}")]
    code, _, err = call(["compare", str(TOPOLOGIES / "paper-3dc.yaml"), "-p", "gpipe", "-p",
                         "1f1b", "-o", "1f1b.sends=eager", "-b", "none", "-b", "greedy",
                         "--repeat", "2", "--jitter", "10%", "--iterations", "3",
                         "--microbatches", "4", *sets, "--out", str(tmp_path / "cli")])
    assert code == 0, err
    by_cli = json.loads((tmp_path / "cli" / "compare.json").read_text())
    by_api = json.loads((tmp_path / "api" / "compare.json").read_text())
    assert by_api["rows"] == by_cli["rows"]
    with pytest.raises(InputError, match="unknown option 'send' for 1f1b"):
        api.compare(inputs, ["1f1b"], options={"1f1b.send": "eager"}, out=tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_settings_are_checked_by_their_fields_and_said_of_the_parameter(
        tmp_path: Path) -> None:
    """The API's settings are the spec's fields: a text is read as its option reads it,
    a value of the wrong type or a setting of the other backend's is one line naming the
    parameter, and a name no function takes is Python's own TypeError."""
    inputs = api.load(TWO_DC, iterations=2)
    with pytest.raises(InputError, match=r"^dilation: applies to --backend emulate only"):
        api.compare(inputs, ["gpipe"], dilation="2", out=tmp_path / "c")
    with pytest.raises(InputError, match=r"^checkpoint_every: expected an int, got str '2'"):
        api.simulate(inputs, checkpoint_every="2", out=tmp_path / "s")
    with pytest.raises(TypeError, match="unexpected keyword argument 'dilation'"):
        api.simulate(inputs, dilation=2, out=tmp_path / "s")
    result = api.simulate(inputs, "gpipe", jitter="5%", trace="none", out=tmp_path / "ok")
    assert result.typed.jitter == {"compute": 0.05, "prefill": 0.05, "network": 0.05,
                                   "share": 0.05, "seed": inputs.job.seed}
    assert not (tmp_path / "ok" / "trace.json.gz").exists()
