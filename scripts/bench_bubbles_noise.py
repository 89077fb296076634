#!/usr/bin/env python3
"""BubbleTea under noise and with long prompts, in the simulator, through `testbed compare`:
paper-3dc with Atlas at 400 requests/s, 10% jitter on compute and prefill, 5 seeds, for
BubbleTea's variants and greedy; and the long-prompt job (benchmarks/long-prompts/job.yaml)
with chunked prefill on and off. Writes benchmarks/bubbles-noise.json (every run's
iteration time, utilization, overruns, requests served and TTFT, `compare`'s table
with each variant's slowdown interval, also as numbers, and the longest bubble the
training-only runs leave).

`.venv/bin/python scripts/bench_bubbles_noise.py [--out runs/bubbles-noise] [--reuse]`:
about 15 minutes on 2 cores; `--reuse` keeps compare directories already in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from testbed.inference.workload import predicted_bubbles
from testbed.report.profile import read_spans

ROOT = Path(__file__).resolve().parent.parent
os.environ["TESTBED_PLANNING_STORE"] = "off"  # every search timed as a first: none read back
NOISE = ("--jitter", "compute=10%,prefill=10%", "--set", "inference.arrival_rate=400/s",
         "--iterations", "4", "--repeat", "5")
LONG = ("--job", "benchmarks/long-prompts/job.yaml")
VARIANTS: dict[str, tuple[str, ...]] = {
    "bubbletea": ("-b", "none", "-b", "bubbletea", *NOISE),
    "bubbletea learn=on": ("-b", "none", "-b", "bubbletea", "-o", "bubbletea.learn=on", *NOISE),
    "bubbletea chunk=off": ("-b", "none", "-b", "bubbletea", "-o", "bubbletea.chunk=off",
                            *NOISE),
    "bubbletea batch=4": ("-b", "none", "-b", "bubbletea", "-o", "bubbletea.batch=4", *NOISE),
    "greedy": ("-b", "none", "-b", "greedy", *NOISE),
    "long prompts, chunk=on": ("-b", "none", "-b", "bubbletea", *LONG),
    "long prompts, chunk=off": ("-b", "bubbletea", "-o", "bubbletea.chunk=off", *LONG),
}


def compare(out: Path, args: tuple[str, ...], reuse: bool) -> None:
    if reuse and (out / "compare.json").exists():
        return
    testbed = str(Path(sys.executable).parent / "testbed")
    subprocess.run([testbed, "compare", "topologies/paper-3dc.yaml", "-p", "atlas", *args,
                    "--out", str(out), "--force"], cwd=ROOT, check=True)


def runs_of(out: Path) -> dict[str, list[dict[str, Any]]]:
    by_bubbles: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(out.glob("runs/*/results.json")):
        results = json.loads(path.read_text())
        inference = results["inference"]
        by_bubbles.setdefault(results.get("bubble_policy") or "none", []).append({
            "iteration_s": results["iteration_time_s"]["median"],
            "util_total": results["gpu_utilization"]["total"],
            "util_training": results["gpu_utilization"]["training"],
            "overruns": inference.get("overruns"),
            **{key: inference.get(key) for key in ("requests", "served", "rejected",
                                                    "pending", "chunked")},
            "ttft_s": inference.get("ttft_s"),
            "dedicated_ttft_s": (inference.get("dedicated") or {}).get("ttft_s"),
            "jitter": results.get("jitter")})
    return by_bubbles


def slowdown(out: Path) -> dict[str, Any] | None:
    """The filled runs' slowdown against the training-only ones, with its 95% interval, as
    compare.json's row has it (None without training-only runs beside them)."""
    rows = json.loads((out / "compare.json").read_text())["rows"]
    interval = next((row["slowdown_interval"] for row in rows
                     if not row["combo"].endswith("+none")), None)
    return interval if isinstance(interval, dict) else None


def longest_bubble_s(out: Path) -> float | None:
    """The longest bubble BubbleTea would predict in the `none` runs (a GPU's shortest wait
    at one receive or all-reduce over the last iterations): what a whole prompt must fit."""
    waits = [wait for path in sorted(out.glob("runs/*+none-*/spans.json"))
             for wait in predicted_bubbles(read_spans(path)).values()]
    return max(waits, default=None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("runs/bubbles-noise"))
    parser.add_argument("--reuse", action="store_true")
    args = parser.parse_args()
    base = args.out if args.out.is_absolute() else ROOT / args.out
    report: dict[str, Any] = {}
    for name, extra in VARIANTS.items():
        out = base / name.replace(" ", "_").replace(",", "").replace("=", "-")
        compare(out, extra, args.reuse)
        report[name] = {
            "command": "testbed compare topologies/paper-3dc.yaml -p atlas " + " ".join(extra),
            "table": (out / "table.md").read_text(), "slowdown": slowdown(out),
            "runs": runs_of(out), "longest_bubble_s": longest_bubble_s(out)}
    target = ROOT / "benchmarks" / "bubbles-noise.json"
    target.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
