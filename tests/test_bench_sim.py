"""scripts/bench_sim.py's reference commit (`--against`): its testbed and plugins run in
place of this checkout's, and its rows sit beside this checkout's in the end-to-end table
with each round's ratio."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from .scripts import script

ROOT = Path(__file__).resolve().parent.parent


def _row(code: str, planning: str, wall: float) -> dict[str, Any]:
    return {"gpus": 8192, "e2e_s": wall, "e2e_cpu_s": wall * 1.8, "planning": planning,
            "planning_s": wall - 3, "load": [1.0, 1.2], "code": code}


def test_the_table_gives_each_round_against_the_reference_in_the_same_round() -> None:
    report = {"reference": "abcdef1234", "atlas_e2e": [
        _row("abcdef1234", "searched", 20.0), _row("abcdef1234", "kept", 5.0),
        _row("this", "searched", 18.0), _row("this", "kept", 5.0),
        _row("this", "searched", 19.0), _row("this", "kept", 5.5),
        _row("abcdef1234", "searched", 20.0), _row("abcdef1234", "kept", 5.0)]}
    table = script("measured_tables").sim_e2e_searched(report)
    rows = {line.split(" | ")[0] + line.split(" | ")[1]: line.split(" | ")
            for line in table.splitlines()[2:]}
    searched = rows["| Atlas, GPT-3 on 8,192 GPUs x 8, 2 iterationssearched"]
    assert searched[2] == "18.0 s, 19.0 s" and searched[6] == "0.90, 0.95"
    assert rows["| Atlas, GPT-3 on 8,192 GPUs x 8, 2 iterationskept"][6] == "1.00, 1.10"
    reference = rows["| Atlas, GPT-3 on 8,192 GPUs x 8, 2 iterations at abcdef1searched"]
    assert reference[2] == "20.0 s, 20.0 s" and reference[6] == "-"


def test_a_table_without_a_reference_has_no_ratios() -> None:
    report = {"atlas_e2e": [{k: v for k, v in _row("this", "searched", 18.0).items()
                             if k != "code"}]}
    line = script("measured_tables").sim_e2e_searched(report).splitlines()[2]
    assert line.split(" | ")[6] == "-"


def test_the_reference_commit_runs_its_own_testbed_and_plugins_and_leaves_no_worktree(
) -> None:
    bench = script("bench_sim")
    with bench.code_at("HEAD") as code:
        tree = Path(code.env["PYTHONPATH"].split(":")[0])
        done = subprocess.run(
            [sys.executable, "-c", "import testbed, testbed_plugins.atlas.policy as p; "
             "print(testbed.__file__); print(p.__file__)"],
            env={**bench.user_env(), **code.env}, capture_output=True, text=True, check=True,
            cwd=tree.parent)  # not this checkout: `-c` puts the working folder first
        found = [Path(line).resolve() for line in done.stdout.split()]
        assert found[0].is_relative_to(tree.resolve())
        assert found[1].is_relative_to((tree / "plugins").resolve())
        assert code.rev == subprocess.run(["git", "rev-parse", "--short=10", "HEAD"], cwd=ROOT,
                                          capture_output=True, text=True).stdout.strip()
    assert not tree.exists()
    listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout
    assert str(tree) not in listed
