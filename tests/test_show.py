"""`testbed show RUN_DIR`: a past run's summary, as the command that ran it printed it, and
its plots, from its files; anything else is refused in one line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from .test_cli import call

ROOT = Path(__file__).resolve().parent.parent
TWO_DC = ROOT / "topologies" / "two-dc.yaml"


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A simulated two-dc run with a link trace and a network event, and what
    `simulate` printed."""
    run = tmp_path_factory.mktemp("show") / "run"
    code, out, err = call(["simulate", str(TWO_DC), "-p", "1f1b", "--scenario",
                           str(ROOT / "scenarios" / "two-dc-wan-trace.yaml"), "--event",
                           "at=0.1s,link=east-west,down=0.05s", "--out", str(run)])
    assert code == 0, err
    return run, out.splitlines()


def test_show_prints_the_summary_simulate_printed_and_draws_the_run(
        simulated: tuple[Path, list[str]]) -> None:
    run, printed = simulated
    for name in ("gantt", "wan"):
        (run / f"{name}.png").unlink(missing_ok=True)
    code, out, err = call(["show", str(run)])
    assert code == 0, err
    lines = out.splitlines()
    assert lines[:-1] == printed[:-1]  # all but simulate's "simulated in ...; results in"
    assert lines[-1] == f"wrote gantt.png, wan.png in {run}"
    for name in ("gantt", "wan"):
        assert (run / f"{name}.png").read_bytes().startswith(b"\x89PNG"), name
        assert (run / f"{name}.csv").read_text().count("\n") > 1, name
    assert not (run / "loss.png").exists()  # the simulator measures no loss


def test_the_summary_names_the_scenario_entries_and_events(
        simulated: tuple[Path, list[str]]) -> None:
    _, printed = simulated
    assert "  scenario      " + str(ROOT / "scenarios" / "two-dc-wan-trace.yaml") in printed
    assert any(line.strip().startswith("trace on east-west: wan-trace.csv, 300 steps, ")
               for line in printed)
    assert "                event: east-west down for 0.05s at 0.1s (applied)" in printed
    assert not any(line.startswith("  applied ") for line in printed)  # all were


def test_show_draws_where_and_in_the_format_asked(simulated: tuple[Path, list[str]],
                                                  tmp_path: Path) -> None:
    run, _ = simulated
    out = tmp_path / "plots" / "svg"
    code, text, err = call(["show", str(run), "--out", str(out), "--format", "svg"])
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["gantt.csv", "gantt.svg", "wan.csv",
                                                     "wan.svg"]
    assert (out / "wan.svg").read_text().startswith("<?xml")
    assert text.splitlines()[-1] == f"wrote gantt.svg, wan.svg in {out}"


def test_show_draws_the_loss_a_run_measured(simulated: tuple[Path, list[str]],
                                            tmp_path: Path) -> None:
    """The loss curve as a run with real compute records it (written into a copy of a
    simulated run's results: the plotting, not the training, is under test)."""
    run, _ = simulated
    copy = tmp_path / "run"
    copy.mkdir()
    for name in ("results.json", "spans.json", "topology.yaml"):
        (copy / name).write_bytes((run / name).read_bytes())
    results = json.loads((copy / "results.json").read_text())
    results["loss_curve"] = [{"iteration": i, "time_s": 0.2 * (i + 1), "tokens": 256 * (i + 1),
                              "loss": 10.0 - i} for i in range(3)]
    results["loss_note"] = None
    (copy / "results.json").write_text(json.dumps(results))
    code, out, err = call(["show", str(copy)])
    assert code == 0, err
    assert "  loss          10.0000 -> 8.0000 over 3 iterations" in out.splitlines()
    rows = list(csv.DictReader((copy / "loss.csv").open()))
    assert [float(r["loss"]) for r in rows] == [10.0, 9.0, 8.0]
    assert out.splitlines()[-1] == f"wrote gantt.png, wan.png, loss.png in {copy}"


def test_show_wan_never_above_the_link_rate_for_overlapping_syncs(tmp_path: Path) -> None:
    """DiLoCo's syncs on paper-3dc, each stage's in one all-reduce: four transfers per
    link that overlap and then run on alone, which spread evenly over their spans showed
    106% of the link."""
    run = tmp_path / "diloco"
    code, _, err = call(["simulate", str(ROOT / "topologies" / "paper-3dc.yaml"), "-p",
                         "diloco", "-o", "inner_steps=2", "-o", "bucket_mb=0",
                         "--iterations", "2", "--trace",
                         "none", "--out", str(run)])
    assert code == 0, err
    code, _, err = call(["show", str(run)])
    assert code == 0, err
    use = [float(r["utilization"]) for r in csv.DictReader((run / "wan.csv").open())]
    assert 0.99 < max(use) <= 1 + 1e-6  # the link was full, and no more than full


@pytest.mark.parametrize("damage", ["missing", "empty", "no-results", "bad-json", "not-results",
                                    "no-spans"])
def test_a_directory_that_is_not_a_run_is_one_line(
        simulated: tuple[Path, list[str]], tmp_path: Path, damage: str) -> None:
    run, _ = simulated
    target = tmp_path / "run"
    if damage != "missing":
        target.mkdir()
    if damage not in ("missing", "empty"):
        for name in ("results.json", "spans.json", "topology.yaml"):
            (target / name).write_bytes((run / name).read_bytes())
    if damage == "no-results":
        (target / "results.json").unlink()
    elif damage == "bad-json":
        (target / "results.json").write_text("{not json")
    elif damage == "not-results":
        (target / "results.json").write_text(json.dumps({"schema_version": 2, "policy": 3}))
    elif damage == "no-spans":
        (target / "spans.json").unlink()
    code, out, err = call(["show", str(target)])
    expected = {"missing": f"{target}: no such directory",
                "empty": f"{target}: not a run's directory: it has no results.json",
                "no-results": f"{target}: not a run's directory: it has no results.json",
                "bad-json": f"{target / 'results.json'}: unreadable",
                "not-results": f"{target / 'results.json'}",
                "no-spans": f"{target / 'spans.json'}: no such file"}[damage]
    assert code == 2 and out == ""
    assert err.startswith(f"testbed: error: {expected}") and err.count("\n") == 1, err
    assert not (target / "gantt.png").exists()
