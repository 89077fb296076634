#!/usr/bin/env python3
"""torch's own pipelining (examples/launch/pipeline.py, under `testbed launch`) beside
testbed's GPipe with real compute (`testbed up -p gpipe --compute real`) on the same
model, shape and placement: WAN bytes per step and step time. As root:

    .venv/bin/python scripts/bench_launch.py --json benchmarks/launch.json

Bytes: testbed counts its messages' bytes; the launch counts TCP payload from the
shaper's counters (testbed.metrics.link_counters), over every step (the first, with
torch's shape inference, included). Step time: testbed's median iteration (the first
left out); the program's median step on its last stage, as it timed them itself (the
first left out)."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTBED = [sys.executable, "-c", "from testbed.cli.main import main; main()"]


def _run(args: list[str]) -> None:
    result = subprocess.run([*TESTBED, *args], capture_output=True, text=True, check=False,
                            cwd=ROOT)
    if result.returncode != 0:
        raise SystemExit(f"testbed {' '.join(args[:2])} failed: {result.stderr[-2000:]}")


def measure(topology: str, steps: int, sets: list[str], work: Path) -> dict[str, Any]:
    """One topology: testbed's run, then the program launched on its placement."""
    topo = str(ROOT / "topologies" / f"{topology}.yaml")
    flags = [f"--set={s}" for s in sets]
    up = work / f"{topology}-up"
    _run(["up", topo, "-p", "gpipe", "--compute", "real", "--iterations", str(steps),
          "--dp", "1", *flags, "--out", str(up), "-q"])
    ran = json.loads((up / "results.json").read_text())
    plan = ran["plan"]
    placement = [plan["placement"][f"0,{s}"][0] for s in range(plan["pp"])]
    ranks = work / f"{topology}-ranks.yaml"
    ranks.write_text("".join(f"- {host}\n" for host in placement))
    from testbed.experiments.inputs import load_inputs

    job = load_inputs(Path(topo), sets=tuple(sets), dp=1).job
    model = job.model
    out = work / f"{topology}-launch"
    _run(["launch", topo, "-p", str(ranks), "--out", str(out), "-q", "--", sys.executable,
          str(ROOT / "examples" / "launch" / "pipeline.py"), "--steps", str(steps),
          "--layers", str(model.layers), "--hidden", str(model.hidden), "--heads",
          str(model.heads), "--seq", str(model.seq_len), "--vocab", str(model.vocab),
          "--microbatches", str(plan["microbatches"]), "--microbatch-size",
          str(plan["microbatch_size"]), "--seed", str(job.seed)])
    launched = json.loads((out / "results.json").read_text())
    last = len(placement) - 1
    step_s = [p["values"]["step_s"] for p in launched["metrics"]
              if p["rank"] == last and p["step"] is not None and p["step"] > 0]
    testbed_bytes = ran["wan"]["bytes"] / ran["iterations"]
    launch_bytes = launched["wan"]["bytes"] / steps
    testbed_s = ran["iteration_time_s"]["median"]
    launch_s = statistics.median(step_s)
    return {"topology": topology, "steps": steps, "sets": sets, "placement": placement,
            "model": {"layers": model.layers, "hidden": model.hidden, "seq": model.seq_len,
                      "microbatches": plan["microbatches"],
                      "microbatch_size": plan["microbatch_size"]},
            "testbed_bytes_per_step": testbed_bytes, "launch_bytes_per_step": launch_bytes,
            "bytes_ratio": launch_bytes / testbed_bytes,
            "launch_wire_bytes_per_step": launched["wan"]["wire_bytes"] / steps,
            "testbed_step_s": testbed_s, "launch_step_s": launch_s,
            "step_ratio": launch_s / testbed_s, "shaper": launched["shaper"]}


def table(report: dict[str, Any]) -> str:
    rows = ["| topology | placement | bytes per step: testbed | torch pipelining | ratio | "
            "step: testbed | torch pipelining | ratio |", "| --- | --- | --- | --- | --- | "
            "--- | --- | --- |"]
    for r in report["runs"]:
        rows.append(f"| {r['topology']} | {', '.join(r['placement'])} | "
                    f"{r['testbed_bytes_per_step'] / 1e3:,.1f} kB | "
                    f"{r['launch_bytes_per_step'] / 1e3:,.1f} kB | {r['bytes_ratio']:.3f} | "
                    f"{r['testbed_step_s'] * 1e3:.1f} ms | {r['launch_step_s'] * 1e3:.1f} ms | "
                    f"{r['step_ratio']:.2f} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--topologies", default="two-dc,paper-3dc")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    sets = {"two-dc": [], "paper-3dc": ["model=tiny", "microbatch_size=2", "microbatches=4"]}
    runs = []
    with tempfile.TemporaryDirectory() as work:
        for topology in args.topologies.split(","):
            runs.append(measure(topology, args.steps, sets.get(topology, []), Path(work)))
            print(table({"runs": runs}).splitlines()[-1], flush=True)
    report = {"runs": runs}
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
