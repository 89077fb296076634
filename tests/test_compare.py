"""`testbed compare` and `testbed report` over the simulator."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from testbed.report.plots import gantt_spans

from .test_plugins import run_testbed

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
    assert "failing failed: policy 'failing' failed while planning: RuntimeError: this policy " \
           "always fails" in lines
    for name in ("compare.json", "compare.csv", "table.md", "iterations.png", "gantt.png",
                 "wan.png", "topology.yaml"):
        assert (out / name).stat().st_size > 0, name
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
