#!/usr/bin/env python3
"""The Python API page's example (docs/api.md, its first Python block) as a user runs it:
a script of its own in a new process, from a folder holding the repository's topologies.

`.venv/bin/python scripts/bench_api_example.py [--rounds N] [--json F]` runs the page's
code N times (default 3) and records what it prints (the run directories' times taken
out), each round's wall time, the CPU time of its processes (Atlas's plan search
simulates its candidates on every core) and the machine's load average before it, so the
time the page states comes from the page's own code, with the load it was measured at.
Planning answers are not kept (`TESTBED_CACHE=off`), as the Python API does not keep
them unless told (`keeping_answers`). scripts/docs_tables.py renders the JSON into the page.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "api.md"
RUN_TIME = re.compile(r"\b\d{8}-\d{6}-")
"""The time in a run directory's name (`runs/20250101-120000-paper-3dc-compare`)."""


def example(page: Path = PAGE) -> str:
    """The page's first Python block: the code a user copies."""
    found = re.search(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.M | re.S)
    if found is None:
        raise SystemExit(f"{page}: no ```python block")
    return found.group(1)


def printed(stdout: str) -> list[str]:
    """What the example prints, its run directories' times replaced by `<time>-`."""
    return [RUN_TIME.sub("<time>-", line) for line in stdout.splitlines()]


def run_once(code: str) -> dict[str, Any]:
    """The code in a new Python process, in a folder of its own with the topologies."""
    with tempfile.TemporaryDirectory(prefix="api-example-") as folder:
        (Path(folder) / "topologies").symlink_to(ROOT / "topologies")
        load = os.getloadavg()[0]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True,
                              text=True, env={**os.environ, "TESTBED_CACHE": "off"},
                              check=False)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"the example failed ({done.returncode}):\n{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu, "load_before": load,
            "printed": printed(done.stdout)}


def measure(rounds: int) -> dict[str, Any]:
    code = example()
    runs = []
    for k in range(rounds):
        runs.append(run_once(code))
        print(f"round {k + 1}: {runs[-1]['wall_s']:.1f} s wall, {runs[-1]['cpu_s']:.1f} s CPU "
              f"(load {runs[-1]['load_before']:.2f} before)", flush=True)
    outputs = {tuple(run["printed"]) for run in runs}
    if len(outputs) != 1:
        raise SystemExit(f"the rounds printed different things: {outputs}")
    return {"code": code, "printed": runs[0]["printed"], "cpus": os.cpu_count(),
            "rounds": [{k: v for k, v in run.items() if k != "printed"} for run in runs]}


def table(report: dict[str, Any]) -> str:
    """The page's block: what the example prints, then each round's times."""
    rounds = report["rounds"]
    walls = [r["wall_s"] for r in rounds]
    lines = ["```text", *report["printed"], "```", "",
             f"| round | wall time | CPU time (its processes) | load average before "
             f"({report['cpus']} CPUs) |", "| --- | --- | --- | --- |"]
    lines += [f"| {k} | {r['wall_s']:.1f} s | {r['cpu_s']:.1f} s | {r['load_before']:.2f} |"
              for k, r in enumerate(rounds, 1)]
    lines += ["", f"Median wall time {statistics.median(walls):.1f} s over "
              f"{len(rounds)} rounds."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "api-example.json")
    args = parser.parse_args()
    report = measure(args.rounds)
    args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(table(report))


if __name__ == "__main__":
    main()
