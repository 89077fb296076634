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
import itertools
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


def rendezvous(work: Path) -> float:
    """Seconds rank 1 (west) takes to receive four messages rank 0 (east) sent at once, on
    two-dc (40 ms round trip): scripts/gloo_rendezvous.py, its median of 3."""
    out = work / "rendezvous"
    _run(["launch", str(ROOT / "topologies" / "two-dc.yaml"), "-p",
          str(ROOT / "examples" / "launch" / "one-per-dc.yaml"), "--out", str(out), "-q",
          "--", sys.executable, str(ROOT / "scripts" / "gloo_rendezvous.py")])
    results = json.loads((out / "results.json").read_text())
    return statistics.median(p["values"]["four_messages_s"] for p in results["metrics"]
                             if p["rank"] == 1)


def measure(topology: str, steps: int, sets: list[str], work: Path,
            without_latency: bool = True) -> dict[str, Any]:
    """One topology: testbed's run, then the program launched on its placement; and the
    same with the WAN's latency near zero (what compute and each framework cost alone)."""
    topo = str(ROOT / "topologies" / f"{topology}.yaml")
    work = work / ("wan" if without_latency else "no-latency")
    work.mkdir(parents=True, exist_ok=True)
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
    _run(["launch", topo, *flags, "-p", str(ranks), "--out", str(out), "-q", "--",
          sys.executable,
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
    topo_model = load_inputs(Path(topo), sets=tuple(sets), dp=1).topology
    rtt = max(2 * topo_model.one_way_latency(topo_model.dc_of(a), topo_model.dc_of(b))
              for a, b in itertools.pairwise(placement))
    near = measure(topology, steps, [*sets, "wan.latency=0.05ms"], work, False) \
        if without_latency else None
    return {"topology": topology, "steps": steps, "sets": sets, "placement": placement,
            "slowest_rtt_s": rtt,
            **({"no_latency": {k: near[k] for k in ("testbed_step_s", "launch_step_s")},
                "launch_step_modeled_s": near["launch_step_s"]
                + 2 * plan["microbatches"] * rtt} if near else {}),
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
            "step: testbed | torch pipelining | ratio | without WAN latency: testbed | "
            "torch pipelining | torch, modeled |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in report["runs"]:
        near = r.get("no_latency") or {}
        modeled = r.get("launch_step_modeled_s")
        rows.append(f"| {r['topology']} | {', '.join(r['placement'])} | "
                    f"{r['testbed_bytes_per_step'] / 1e3:,.1f} kB | "
                    f"{r['launch_bytes_per_step'] / 1e3:,.1f} kB | {r['bytes_ratio']:.3f} | "
                    f"{r['testbed_step_s'] * 1e3:.1f} ms | {r['launch_step_s'] * 1e3:.1f} ms | "
                    f"{r['step_ratio']:.2f} | " + " | ".join(
                        "-" if v is None else f"{v * 1e3:.1f} ms" for v in (
                            near.get("testbed_step_s"), near.get("launch_step_s"), modeled))
                    + " |")
    if "gloo_four_messages_s" in report:
        rows += ["", "| gloo: four 16 KiB messages sent at once, received one after another, "
                 "two-dc (40 ms round trip) |", "| --- |",
                 f"| {report['gloo_four_messages_s'] * 1e3:.1f} ms |"]
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--topologies", default="two-dc,paper-3dc")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    # pipelines that cross the WAN: two-dc's 4 GPUs in 4 stages (east, east, west, west);
    # paper-3dc with one GPU per DC (east, central, west) and the tiny model
    sets = {"two-dc": ["pp=4"],
            "paper-3dc": ["dc.gpus=1", "model=tiny", "microbatch_size=2", "microbatches=4",
                          "pp=3"]}
    runs = []
    with tempfile.TemporaryDirectory() as work:
        four = rendezvous(Path(work))
        print(f"gloo: four messages sent at once received in {four * 1e3:.1f} ms", flush=True)
        for topology in args.topologies.split(","):
            runs.append(measure(topology, args.steps, sets.get(topology, []), Path(work)))
            print(table({"runs": runs}).splitlines()[-1], flush=True)
    report = {"runs": runs, "gloo_four_messages_s": four}
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
