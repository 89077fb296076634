#!/usr/bin/env python3
"""Wall time of one two-knob sweep run by one process, by two local worker processes and
by a local Ray instance of two CPUs, and whether all of them write the same sweep.csv.

`.venv/bin/python scripts/bench_sweep.py [--rounds N] [--json F] [--from-json F]
[--readme docs/comparing.md]`: each round runs the three one after another (the order turning
each round, so a burst of load on a shared machine does not always fall on one), and a
ratio is the one-process time over the other's in the same round. The machine's load
average is recorded before and after each run: on a machine shared with others, a ratio
is only as good as the quiet it was measured in. CPU seconds (of the sweep and the worker
processes it waited for; not Ray's, which Ray's own processes run) show what running in
parallel costs besides the points themselves.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
os.environ["TESTBED_PLANNING_STORE"] = "off"  # every search timed as a first: none read back
SWEEP = ["topologies/paper-3dc.yaml", "-p", "gpipe", "-p", "atlas",
         "--vary", "wan.latency=10ms,20ms,40ms,80ms", "--vary", "wan.bandwidth=1Gbit,10Gbit"]
MODES: dict[str, list[str]] = {
    "1 process": ["--workers", "1"],
    "2 workers": ["--workers", "2"],
    "Ray local, 2 CPUs": ["--workers", "2", "--ray", "local"],
}


def one_run(mode: str, out: Path) -> dict[str, Any]:
    testbed = Path(sys.executable).parent / "testbed"
    before = os.getloadavg()[0]
    cpu = _children_cpu()
    started = time.monotonic()
    done = subprocess.run([str(testbed), "sweep", *SWEEP, *MODES[mode], "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    wall = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{mode}: {done.stderr.strip().splitlines()[-1]}")
    # Ray's worker processes are not reaped by this one: their CPU is not counted
    used = None if "--ray" in MODES[mode] else round(_children_cpu() - cpu, 2)
    return {"mode": mode, "wall_s": round(wall, 2), "cpu_s": used,
            "load_before": round(before, 2),
            "load_after": round(os.getloadavg()[0], 2),
            "csv": (out / "sweep.csv").read_text()}


def _children_cpu() -> float:
    """User and system seconds of every process this one has waited for, theirs included
    (a sweep's workers, Ray's processes)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def measure(rounds: int) -> dict[str, Any]:
    names = list(MODES)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for number in range(rounds):
            order = names[number % len(names):] + names[:number % len(names)]
            for mode in order:
                run = one_run(mode, Path(tmp) / f"{number}-{names.index(mode)}")
                run["round"] = number + 1
                runs.append(run)
                print(f"round {number + 1}: {mode}: {run['wall_s']:.1f} s "
                      f"(load {run['load_before']:.2f} -> {run['load_after']:.2f})",
                      file=sys.stderr)
    csvs = {run.pop("csv") for run in runs}
    ratios: dict[str, list[float]] = {}
    for number in range(1, rounds + 1):
        of = {r["mode"]: r["wall_s"] for r in runs if r["round"] == number}
        for mode in names[1:]:
            ratios.setdefault(mode, []).append(round(of[names[0]] / of[mode], 2))
    return {"command": "testbed sweep " + " ".join(SWEEP), "points": 8,
            "cores": len(os.sched_getaffinity(0)), "rounds": rounds, "runs": runs,
            "speedup_vs_1_process": ratios,
            "median_speedup": {m: statistics.median(v) for m, v in ratios.items()},
            "same_csv": len(csvs) == 1}


def table(report: dict[str, Any]) -> str:
    """The documentation's table, from the benchmark's JSON alone."""
    lines = ["| round | " + " | ".join(MODES) + " | CPU seconds of each | load average "
             "(1 min) before each |",
             "| --- | " + " | ".join("---" for _ in MODES) + " | --- | --- |"]
    for number in range(1, report["rounds"] + 1):
        of = {r["mode"]: r for r in report["runs"] if r["round"] == number}
        cells = [f"{of[m]['wall_s']:.1f} s" + (
            "" if m == next(iter(MODES)) else
            f" ({report['speedup_vs_1_process'][m][number - 1]:.2f}x)") for m in MODES]
        loads = ", ".join(f"{of[m]['load_before']:.1f}" for m in MODES)
        cpu = ", ".join("-" if of[m].get("cpu_s") is None else f"{of[m]['cpu_s']:.0f}"
                        for m in MODES)
        lines.append(f"| {number} | " + " | ".join(cells) + f" | {cpu} | {loads} |")
    same = "the same sweep.csv" if report["same_csv"] else "DIFFERENT sweep.csv files"
    lines += ["", f"{report['points']} points x 2 policies on {report['cores']} cores; every "
              f"run wrote {same}."]
    return "\n".join(lines)


def write_readme(page: Path, report: dict[str, Any], source: Path | None) -> None:
    """The table into `page` (docs/...) between its markers, stamped with the commit
    of `source`, the JSON it came from (scripts/docs_tables.py does the same from the JSON)."""
    from docs_tables import write_block

    write_block(page, "sweep-speed", table(report), [] if source is None else [source])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="write the measurements here")
    parser.add_argument("--from-json", type=Path, help="render this report, run nothing")
    parser.add_argument("--readme", type=Path, metavar="PAGE.md",
                        help="rewrite the table between the markers of this page "
                        "(docs/comparing.md)")
    args = parser.parse_args()
    report = json.loads(args.from_json.read_text()) if args.from_json else measure(args.rounds)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    if args.readme:
        write_readme(args.readme, report, args.json or args.from_json)


if __name__ == "__main__":
    main()
