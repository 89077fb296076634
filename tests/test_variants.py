"""One policy with two option sets in one comparison (`-p diloco:h2 -p diloco:h3`), a
policy given twice refused, and every command saying when it runs more iterations than
asked (whole cycles)."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import pytest

from testbed import api, errors
from testbed.errors import InputError
from testbed.policy.routing import options_for, variants

from .test_cli import call

ROOT = Path(__file__).resolve().parent.parent
TWO = ROOT / "topologies" / "two-dc.yaml"
ROUNDED = ("testbed: warning: diloco: running 6 iterations, not 4: the plan's cycle is 3 "
           "iterations long, and a run measures whole cycles")


def test_labelled_variants_are_rows_of_their_own_with_their_own_options(
        tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    code, stdout, err = call([
        "compare", str(TWO), "-p", "gpipe", "-p", "diloco:h2", "-p", "diloco:h3",
        "-o", "diloco.inner_steps=3", "-o", "diloco:h2.inner_steps=2",
        "-o", "diloco.outer_lr=0.5", "--iterations", "6", "--out", str(out)])
    assert code == 0, err
    table = stdout.splitlines()
    assert [line.split()[0] for line in table[2:5]] == ["gpipe", "diloco:h2", "diloco:h3"]
    saved = json.loads((out / "compare.json").read_text())
    assert [row["combo"] for row in saved["rows"]] == ["gpipe", "diloco:h2", "diloco:h3"]
    assert [r["directory"] for r in saved["runs"]] == [
        "runs/gpipe-r1", "runs/diloco_h2-r1", "runs/diloco_h3-r1"]
    options = {r["policy"]: json.loads((out / r["directory"] / "results.json").read_text())
               for r in saved["runs"]}
    assert options["diloco:h2"]["policy"] == options["diloco:h3"]["policy"] == "diloco"
    # the label's own option over the policy's, the policy's to every variant
    assert options["diloco:h2"]["policy_options"] == {"inner_steps": "2", "outer_lr": "0.5"}
    assert options["diloco:h3"]["policy_options"] == {"inner_steps": "3", "outer_lr": "0.5"}
    assert options["diloco:h2"]["cycle_time_s"]["period"] == 2
    assert options["diloco:h3"]["cycle_time_s"]["period"] == 3
    h2, h3 = saved["rows"][1], saved["rows"][2]
    assert h2["tokens_per_s"] != h3["tokens_per_s"]  # two option sets, two results
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert [r["policy"] for r in rows] == ["gpipe", "diloco:h2", "diloco:h3"]
    assert [r["policy_options.inner_steps"] for r in rows] == ["", "2", "3"]
    code, again, err = call(["report", str(out), "--no-plots"])
    assert code == 0, err
    assert again.splitlines()[:5] == table[:5]


@pytest.mark.parametrize(("policies", "problem"), [
    (["diloco", "diloco"], "--policy: diloco is given twice (to run it with two option sets, "
                           "label each: -p diloco:a -p diloco:b)"),
    (["gpipe", "diloco:h2", "diloco:h2"], "--policy: diloco:h2 is given twice"),
    (["diloco:h.2"], "--policy: 'diloco:h.2': expected POLICY:LABEL, a label of letters, "
                     "digits, - and _ (it names the row and its -o options)"),
    (["diloco:"], "--policy: 'diloco:': expected POLICY:LABEL"),
    (["diloco:h2", "-o", "diloco:h3.inner_steps=3"],
     "--option: 'diloco:h3.inner_steps=3' is for 'diloco:h3', which is not compared here "
     "(did you mean 'diloco:h2'?)"),
    (["nosuch:h2"], "nosuch"),
])
def test_a_repeated_or_bad_variant_is_one_line_before_anything_runs(
        tmp_path: Path, policies: list[str], problem: str) -> None:
    args = ["compare", str(TWO)]
    for word in policies:
        args += [word] if word.startswith("-") or "=" in word else ["-p", word]
    out = tmp_path / "cmp"
    code, _, err = call([*args, "--out", str(out)])
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("testbed: error: ")
    assert problem in err
    assert not out.exists()


def test_compare_says_when_it_runs_whole_cycles_once(tmp_path: Path) -> None:
    code, _, err = call(["compare", str(TWO), "-p", "gpipe", "-p", "diloco", "-o",
                         "diloco.inner_steps=3", "--iterations", "4", "--repeat", "2",
                         "--out", str(tmp_path / "cmp")])
    assert code == 0, err
    assert err.splitlines().count(ROUNDED) == 1
    runs = json.loads((tmp_path / "cmp" / "compare.json").read_text())["runs"]
    assert [r["results"]["iterations"] for r in runs] == [4, 4, 6, 6]


def test_simulate_and_sweep_say_it_too(tmp_path: Path) -> None:
    code, _, err = call(["simulate", str(TWO), "-p", "diloco", "-o", "inner_steps=3",
                         "--iterations", "4", "--out", str(tmp_path / "sim")])
    assert code == 0, err
    assert ROUNDED in err.splitlines()
    # two points in two worker processes: what each run warned of is said here
    code, _, err = call(["sweep", str(TWO), "-p", "diloco", "--vary",
                         "option.inner_steps=3,5", "--iterations", "4", "--workers", "2",
                         "--out", str(tmp_path / "sweep")])
    assert code == 0, err
    lines = err.splitlines()
    assert lines.count(ROUNDED) == 1
    assert lines.count(ROUNDED.replace("6 iterations", "5 iterations").replace(
        "is 3 iterations", "is 5 iterations")) == 1


def test_api_compare_keys_variants_by_label_and_warns_of_cycles(tmp_path: Path) -> None:
    inputs = api.load(TWO, iterations=4)
    with pytest.warns(errors.TestbedWarning, match="diloco: running 6 iterations, not 4"):
        runs = api.compare(inputs, ["diloco:h2", "diloco:h3"],
                           options={"diloco:h2.inner_steps": 2, "diloco.inner_steps": 3},
                           out=tmp_path / "cmp")
    assert list(runs) == ["diloco:h2", "diloco:h3"]
    assert runs["diloco:h2"].results["iterations"] == 4
    assert runs["diloco:h3"].results["iterations"] == 6
    assert [row.combo for row in runs.rows] == ["diloco:h2", "diloco:h3"]
    with pytest.raises(InputError, match="diloco:h2 is given twice"):
        api.compare(inputs, ["diloco:h2", "diloco:h2"], out=tmp_path / "twice")


def test_options_go_to_the_most_specific_owner_whatever_their_order() -> None:
    pairs = ["diloco:a.k=label", "diloco.k=policy", "k=all", "diloco:b.j=b"]
    assert options_for("diloco", pairs, label="diloco:a") == {"k": "label"}
    assert options_for("diloco", pairs, label="diloco:b") == {"k": "policy", "j": "b"}
    assert options_for("diloco", pairs) == {"k": "policy"}
    assert options_for("gpipe", pairs) == {"k": "all"}
    assert options_for("bubbletea", pairs, False) == {}
    assert [(v.policy, v.name) for v in variants(["diloco", "diloco:a"])] == [
        ("diloco", "diloco"), ("diloco", "diloco:a")]


def test_a_run_whose_iterations_are_whole_cycles_says_nothing(tmp_path: Path) -> None:
    inputs = api.load(TWO, iterations=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.TestbedWarning)
        api.simulate(inputs, "diloco", {"inner_steps": "3"}, out=tmp_path / "run")
