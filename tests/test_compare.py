"""`testbed compare` and `testbed report` over the simulator."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from testbed.cli.compare import write_compare
from testbed.metrics.loss import loss_curve, time_to_loss
from testbed.metrics.summary import summarize
from testbed.report.compare import (
    NOTE_CHARS,
    RunEntry,
    markdown_table,
    table_rows,
    table_text,
)
from testbed.report.gantt import gantt_spans
from testbed.report.plots import loss_plot

from .test_cli import call
from .test_metrics import uneven_spans
from .test_plugins import run_testbed

pytestmark = pytest.mark.usefixtures("shared_planning")

ROOT = Path(__file__).resolve().parent.parent


def test_compare_writes_rows_files_and_plots_and_report_reproduces_them(
        tmp_path: Path, plugin_path: Path) -> None:
    out = tmp_path / "cmp"
    result = run_testbed(["compare", str(ROOT / "topologies" / "paper-3dc.yaml"), "-p", "gpipe",
                          "-p", "failing", "-p", "1f1b", "--repeat", "2", "--iterations", "3",
                          "--out", str(out)], plugin_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    table = "\n".join(lines[:5])
    assert "gpipe" in table and "1f1b" in table
    assert any(line.startswith("failing ") and "failed" in line for line in lines)
    assert any(line.startswith("failing failed: policy 'failing' failed while planning: "
                               "RuntimeError: this policy always fails (at ") for line in lines)
    for name in ("compare.json", "compare.csv", "table.md", "throughput.png", "gantt.png",
                 "wan.png", "topology.yaml"):
        assert (out / name).stat().st_size > 0, name
    assert json.loads((out / "compare.json").read_text())["job_overrides"] == {"iterations": 3}
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert [(r["policy"], r["repeat"]) for r in rows] == [
        ("gpipe", "0"), ("gpipe", "1"), ("failing", "0"), ("failing", "1"), ("1f1b", "0"),
        ("1f1b", "1")]
    ok = [r for r in rows if r["status"] == "ok"]
    assert all(float(r["iteration_time_s.median"]) > 0 for r in ok)
    assert all(r["backend"] == "simulate" for r in ok)
    assert {r["status"] for r in rows if r["policy"] == "failing"} == {"failed"}
    for row in ok:  # every field of the run's results.json is in its row
        results = json.loads((out / row["directory"] / "results.json").read_text())
        assert float(row["tokens_per_s"]) == results["tokens_per_s"]
    again = run_testbed(["report", str(out)], None)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[:5] == lines[:5]


def test_gantt_spans_match_the_trace(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    result = run_testbed(["compare", str(ROOT / "topologies" / "two-dc.yaml"), "-p", "1f1b",
                          "--out", str(out)], None)
    assert result.returncode == 0, result.stderr
    run_dir = out / "runs" / "1f1b-r1"
    data = json.loads((run_dir / "spans.json").read_text())
    shown, lo, hi = gantt_spans(data["spans"], data["start"], 1)
    steps = sorted(s["end"] for s in data["spans"] if s["kind"] == "step")
    assert lo < hi
    computes = [s for s in data["spans"] if s["kind"] in ("forward", "backward")
                and s["start"] < hi and s["end"] > lo]
    assert computes and all(s in shown for s in computes)
    assert all(s["end"] > lo and s["start"] < hi for s in shown)
    assert max(steps) >= hi


def test_compare_runs_gpipe_without_filling_and_says_why_a_row_failed(tmp_path: Path) -> None:
    paper = str(ROOT / "topologies" / "paper-3dc.yaml")
    result = run_testbed(["compare", paper, "-p", "gpipe", "-p", "1f1b", "-b", "none",
                          "--iterations", "2", "--out", str(tmp_path / "none")], None)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[2:4]}
    assert "failed" not in rows["gpipe+none"] and "1.00x" in rows["gpipe+none"]
    assert rows["1f1b+none"].split()[3].endswith("x")  # a speed-up against GPipe
    # with a policy that fills, GPipe's first stage cannot hold the inference model
    out = tmp_path / "greedy"
    result = run_testbed(["compare", paper, "-p", "gpipe", "-p", "1f1b", "-b", "greedy",
                          "--iterations", "2", "--out", str(out)], None)
    assert result.returncode == 0, result.stderr
    why = ("gpipe+greedy failed: " + paper + ": job.inference: filling bubbles does not fit: "
           "stage 0 (14 layers) needs 72.7 GiB per GPU")
    baseline = "no speed-ups: the baseline gpipe+greedy has no tokens/s"
    for text in (result.stdout, (out / "table.md").read_text()):
        lines = text.splitlines()
        assert any(line.startswith(why) for line in lines)
        assert baseline in lines


def _entry(combo: str, repeat: int, error: str | None) -> RunEntry:
    policy, _, bubble = combo.partition("+")
    results = None if error else {
        "iteration_time_s": {"median": 2.0}, "tokens_per_s": 1.0,
        "gpu_utilization": {"training": 0.5, "total": 0.5}, "wan": {"utilization": 0.1},
        "inference": {"ttft_s": {"p50": None, "p99": None}}}
    return RunEntry(policy, bubble or None, repeat, f"runs/{combo}-r{repeat + 1}",
                    "failed" if error else "ok", error, results)


def test_every_failed_row_says_why_in_one_line() -> None:
    long_error = "plugin said:\nTraceback (most recent call last):\n" + "x" * 1000
    rows = table_rows([_entry("a", 0, None), _entry("a", 1, "a: link down"),
                       _entry("b", 0, long_error), _entry("b", 1, long_error)])
    lines = table_text(rows).splitlines()
    assert "a: 1 of 2 runs failed: a: link down" in lines
    [note] = [line for line in lines if line.startswith("b failed: ")]
    assert note.startswith("b failed: plugin said:\\nTraceback (most recent call last):\\nxxx")
    assert note.endswith("...") and len(note) == len("b failed: ") + NOTE_CHARS
    assert not any("no speed-ups" in line for line in lines)  # the baseline has a time
    assert markdown_table(rows).splitlines()[-2:] == lines[-2:]


def _timed(repeat: int, median: float) -> RunEntry:
    entry = _entry("a", repeat, None)
    assert entry.results is not None
    entry.results["iteration_time_s"]["median"] = median
    return entry


def test_the_spread_is_over_repeats_and_a_single_run_has_none() -> None:
    """One repeat showed `21.531-21.531`, a spread of nothing."""
    def spread(entries: list[RunEntry]) -> str:
        header, _, row = table_text(table_rows(entries)).splitlines()[:3]
        column = header.index("spread (s)")
        return row[column:].split()[0]

    assert spread([_timed(0, 21.531)]) == "-"
    assert "| a | 21.531 | - |" in markdown_table(table_rows([_timed(0, 21.531)]))
    assert spread([_timed(0, 21.531), _timed(1, 20.5)]) == "20.500-21.531"
    # a repeat that failed leaves one time: no spread either
    assert spread([_timed(0, 21.531), _entry("a", 1, "link down")]) == "-"



PAPER = str(ROOT / "topologies" / "paper-3dc.yaml")


@pytest.mark.parametrize(("args", "expected"), [
    (["-p", "gpipe", "-p", "atlass"], "unknown training policy 'atlass' (did you mean 'atlas'?)"),
    (["-p", "atlas", "-o", "atlas.conections=4"],
     "--option: conections: unknown option 'conections' for atlas (did you mean "
     "'connections'?)"),
    (["-p", "atlas", "-o", "atlass.connections=4"],
     "--option: 'atlass.connections=4' is for 'atlass', which is not compared here (did you "
     "mean 'atlas'?)"),
    (["-p", "atlas", "-o", "atlas.temporal=of"], "bad value 'of' for atlas: on or off"),
    (["-p", "gpipe", "-o", "gpipe.sends=eagr"],
     "bad value 'eagr' for gpipe: one of torch, eager (did you mean 'eager'?)"),
    (["-p", "gpipe", "-b", "greedy", "-b", "bubbletee"],
     "unknown bubble policy 'bubbletee' (did you mean 'bubbletea'?)"),
    (["-p", "gpipe", "-b", "greedy", "-o", "greedy.deadline=1"],
     "unknown option 'deadline' for greedy"),
])
def test_a_mistyped_policy_or_option_stops_compare_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], expected: str) -> None:
    """Not a `failed` row after the other runs (minutes, emulated): exit 2 at once, with
    nothing made (no comparison directory, no run directory)."""
    monkeypatch.chdir(tmp_path)
    code, out, err = call(["compare", PAPER, *args])
    assert (code, out) == (2, "")
    assert err.startswith("testbed: error: ") and err.count("\n") == 1
    assert expected in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["simulate"], ["plan"], ["sweep", "--vary", "dcs=2,3"]])
def test_every_command_refuses_a_mistyped_policy_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, err = call([command[0], PAPER, "-p", "gpip", *command[1:]])
    assert code == 2 and "unknown training policy 'gpip' (did you mean 'gpipe'?)" in err
    assert list(tmp_path.iterdir()) == []


def test_simulate_refuses_a_mistyped_bubble_policy_before_writing(tmp_path: Path) -> None:
    """The bubble policy was built only once the run had started, after its job.yaml."""
    out = tmp_path / "run"
    code, _, err = call(["simulate", PAPER, "-b", "bubbletee", "--out", str(out)])
    assert code == 2 and "unknown bubble policy 'bubbletee'" in err
    assert not out.exists()
    code, _, err = call(["simulate", PAPER, "-b", "greedy", "-B", "x=1", "--out", str(out)])
    assert code == 2 and "unknown option 'x' for greedy" in err
    assert not out.exists()


@pytest.mark.usefixtures("clean_host")  # root: a mistake must stop `up` before any namespace
def test_up_refuses_a_mistyped_policy_before_the_network(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, _, err = call(["up", str(ROOT / "topologies" / "two-dc.yaml"), "-p", "gpipe",
                         "-o", "conections=2", "--out", str(out)])
    assert code == 2 and "unknown option 'conections' for gpipe" in err
    assert not out.exists()


def test_compare_without_policies_runs_the_default_against_atlas(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    code, _, err = call(["compare", str(ROOT / "topologies" / "two-dc.yaml"), "--out", str(out)])
    assert code == 0, err
    assert json.loads((out / "compare.json").read_text())["policies"] == ["1f1b", "atlas"]
def _measured(policy: str, lengths: list[float], tokens: int) -> RunEntry:
    """A run whose results come from iterations of these lengths, as `summarize` has them."""
    summary = summarize(uneven_spans(lengths), ["a", "b"], 0.0, tokens, 0.0)
    results = {**summary.as_results(), "status": "ok", "compute": "modeled",
               "inference": {"ttft_s": {"p50": None, "p99": None}}}
    return RunEntry(policy, None, 0, f"runs/{policy}-r1", "ok", None, results)


def test_speedup_is_the_ratio_of_tokens_per_s_when_iterations_differ() -> None:
    every_step = _measured("dp", [3.0] * 11, 8000)  # 1 s per step
    # nine short inner steps and one long sync: half the median time, a third the rate
    rarely = _measured("diloco", [2.0] + ([0.5] * 9 + [10.0]) * 2, 1000)
    rows = table_rows([every_step, rarely])
    tokens = [e.results["tokens_per_s"] for e in (every_step, rarely) if e.results]
    assert rows[1].speedup == pytest.approx(tokens[1] / tokens[0])  # 0.26x
    medians = rows[0].iteration_s / rows[1].iteration_s  # type: ignore[operator]
    assert medians == pytest.approx(6.0) and rows[1].speedup < 0.3
    assert table_text(rows).splitlines()[3].split()[3] == f"{tokens[1] / tokens[0]:.2f}x"


def test_a_target_loss_in_the_simulator_is_the_loss_models_prediction(tmp_path: Path) -> None:
    """Exact methods share one curve: the same tokens to the target, their times apart
    only by tokens/s; the table says the times are predicted, sorts by them and shows
    effective tokens/s (equal to tokens/s for an exact method)."""
    two_dc = str(ROOT / "topologies" / "two-dc.yaml")
    out = tmp_path / "cmp"
    result = run_testbed(["compare", two_dc, "-p", "gpipe", "-p", "1f1b", "--iterations", "3",
                          "--target-loss", "9", "--out", str(out)], None)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "effective tokens/s" in lines[0] and "time to loss 9 (predicted)" in lines[0]
    saved = json.loads((out / "compare.json").read_text())
    assert saved["target_loss"] == 9.0
    times = [row["to_loss"]["time_s"] for row in saved["rows"]]
    assert times == sorted(times) and all(t > 0 for t in times)
    assert any("sorted by time to loss" in line for line in lines)
    blocks = [run["results"]["time_to_loss"] for run in saved["runs"]]
    assert {b["basis"] for b in blocks} == {"predicted"}
    assert len({b["tokens"] for b in blocks}) == 1  # one curve for every exact method
    predictions = [run["results"]["loss_model"] for run in saved["runs"]]
    assert {p["penalty"] for p in predictions} == {1.0}
    assert len({p["predicted_loss_at_end"] for p in predictions}) == 1
    for run in saved["runs"]:
        results = run["results"]
        assert results["loss_curve"] is None
        assert results["time_to_loss"]["time_s"] == pytest.approx(
            results["time_to_loss"]["tokens"] / results["tokens_per_s"], rel=1e-6)
        assert results["loss_model"]["target"]["effective_tokens_per_s"] == pytest.approx(
            results["tokens_per_s"])
    rows = list(csv.DictReader((out / "compare.csv").open()))
    assert {r["time_to_loss.basis"] for r in rows} == {"predicted"}
    assert not (out / "loss.png").exists()  # nothing measured to draw
    again = run_testbed(["report", str(out)], None)
    assert again.returncode == 0 and again.stdout.splitlines()[:4] == lines[:4]
    one = run_testbed(["simulate", two_dc, "--target-loss", "9", "--out",
                       str(tmp_path / "one")], None)
    assert one.returncode == 0, one.stderr
    said = [line for line in one.stdout.splitlines() if "loss" in line.split(";")[0]]
    assert len(said) == 1 and said[0].startswith("  time to loss  ")
    assert said[0].endswith("tokens to loss 9 (predicted by the loss model)")


def test_a_target_the_loss_model_rules_out_is_one_line(tmp_path: Path) -> None:
    two_dc = str(ROOT / "topologies" / "two-dc.yaml")
    result = run_testbed(["simulate", two_dc, "--target-loss", "1.5", "--out",
                          str(tmp_path / "low")], None)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "testbed: error: target_loss: loss 1.5 is below 1.8172, the irreducible loss of the "
        "loss model 'published': no model size or token count reaches it"]
    unreachable = run_testbed(["simulate", two_dc, "--target-loss", "3", "--out",
                               str(tmp_path / "floor")], None)
    assert unreachable.returncode == 0, unreachable.stderr
    assert "approaches at" in unreachable.stdout  # below the tiny model's floor: said so


def test_a_bad_target_loss_is_one_line_and_exit_2(tmp_path: Path) -> None:
    two_dc = str(ROOT / "topologies" / "two-dc.yaml")
    for bad in ("nan", "-1", "0", "low"):
        result = run_testbed(["simulate", two_dc, "--target-loss", bad, "--out",
                              str(tmp_path / bad)], None)
        assert result.returncode == 2, result.stderr
        assert result.stderr == ("testbed: error: --target-loss: must be a number above 0 "
                                 f"(a cross-entropy loss), got {bad!r}\n")
        assert not (tmp_path / bad).exists()


def _trained(policy: str, losses: list[float], target: float) -> RunEntry:
    """A run with real compute: one iteration per second after a 2 s warm-up."""
    summary = summarize(uneven_spans([2.0] + [1.0] * (len(losses) - 1)), ["a", "b"], 0.0,
                        100, 0.0)
    curve = loss_curve(dict(enumerate(losses)), summary.iteration_ends_s, 100)
    results = {**summary.as_results(), "status": "ok", "compute": "real",
               "inference": {"ttft_s": {"p50": None, "p99": None}}, "loss_curve": curve,
               "time_to_loss": time_to_loss(curve, target)}
    return RunEntry(policy, None, 0, f"runs/{policy}-r1", "ok", None, results)


def test_compare_files_table_and_plot_carry_the_time_to_loss(tmp_path: Path) -> None:
    entries = [_trained("fast", [5.0, 4.0, 2.9, 2.0], 3.0),
               _trained("slow", [5.0, 4.5, 4.0, 3.5], 3.0)]
    write_compare(tmp_path, {"target_loss": 3.0}, entries)
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["rows"][0]["to_loss"]["time_s"] == pytest.approx(4.0)
    assert saved["rows"][1]["to_loss"] == {
        "target": 3.0, "time_s": None, "tokens": None, "reached": 0, "not_reached": 1,
        "why": "not reached in 4 iterations; lowest loss 3.5000", "compute": "real",
        "basis": "measured", "default": False, "fastest_s": None, "slowest_s": None,
        "effective_tokens_per_s": None, "extrapolated": False, "model": None, "budget": None}
    rows = {r["policy"]: r for r in csv.DictReader((tmp_path / "compare.csv").open())}
    assert float(rows["fast"]["time_to_loss.time_s"]) == pytest.approx(4.0)
    assert rows["fast"]["time_to_loss.tokens"] == "300"
    assert rows["slow"]["time_to_loss.reached"] == "False"
    assert "loss_curve" not in rows["fast"]  # in each run's results.json
    lines = table_text(table_rows(entries)).splitlines()
    assert lines[0].split()[7:12] == ["time", "to", "loss", "3", "(measured)"]
    assert lines[2].split()[5] == "4.000s" and lines[3].split()[5:7] == ["not", "reached"]
    assert "slow: loss <= 3 not reached in 4 iterations; lowest loss 3.5000" in lines
    assert "| 4.000 s |" in markdown_table(table_rows(entries))
    loss_plot([(e.combo, e.results["loss_curve"]) for e in entries if e.results],
              tmp_path / "loss.png", 3.0)
    assert (tmp_path / "loss.png").read_bytes().startswith(b"\x89PNG")
