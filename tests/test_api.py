"""The Python API gives what the commands give: the same plan, files and figures."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from testbed import api
from testbed.errors import InputError

from .conftest import TOPOLOGIES

ROOT = Path(__file__).resolve().parent.parent


def test_compare_writes_each_run_and_returns_typed_results(tmp_path: Path) -> None:
    inputs = api.load(TOPOLOGIES / "two-dc.yaml", iterations=3, sets={"model.layers": 6})
    assert inputs.job.iterations == 3 and inputs.job.model.layers == 6
    runs = api.compare(inputs, ["gpipe", "1f1b"], out=tmp_path)
    for name, result in runs.items():
        written = json.loads((tmp_path / name / "results.json").read_text())
        assert written == result.results
        assert result.iteration_s == written["iteration_time_s"]["median"] > 0
        assert result.record.plan.policy == name and result.error is None


def test_plan_and_simulate_match_the_commands(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from testbed.cli import cli

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


def test_the_readme_script_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (ROOT / "README.md").read_text()
    script = re.search(r"## Scripting experiments.*?```python\n(.*?)```", readme, re.S)
    assert script, "the README shows a script using testbed.api"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "topologies").symlink_to(ROOT / "topologies")
    exec(compile(script.group(1), "README.md", "exec"), {})
    assert any((tmp_path / "runs").iterdir())
