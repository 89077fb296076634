#!/usr/bin/env python3
"""The simulator: how fast it runs at paper scale, and how close it is to the emulator.

`.venv/bin/python scripts/bench_sim.py [--repeat 3] [--skip-emulator] [--sizes 8192x8,...]
[--json F]`
(the emulator part needs root). Prints markdown tables:
1. wall time to simulate one iteration of GPT-3 175B (tp 8, pp 16, 1F1B) from 128 to
   32,768 GPUs with 8, 32 and 128 microbatches (up to a million GPU-microbatches), and how
   the cost grows with the GPU count at 8 microbatches (the exponent of a power law fit
   from 4,096 GPUs up); with `--atlas GPUS`, Atlas's planning and simulation there;
2. simulated vs emulated iteration time (emulated compute) for each shipped emulator
   topology and baseline policy, with the FLOP model and with a profile measured by the
   emulated run itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from testbed.inputs import load_inputs
from testbed.policy import training_policy
from testbed.sim.planning import plan_with_simulator
from testbed.sim.profile import profile_from_spans
from testbed.sim.simulate import simulate_plan
from testbed.sim.simulator import Simulator
from testbed.sim.sweep import vary

ROOT = Path(__file__).resolve().parent.parent


DEFAULT_SIZES = tuple((gpus, m) for gpus in (128, 1024, 4096, 8192, 16384, 32768)
                      for m in (8, 32, 128) if gpus * m <= 2**20)


def scale_table(sizes: tuple[tuple[int, int], ...] = DEFAULT_SIZES) -> list[dict[str, Any]]:
    """(GPUs, microbatches) each: 4 DCs of GPUs/4, dp GPUs/128 (tp 8, pp 16)."""
    inputs = load_inputs(ROOT / "topologies" / "gpt3-4dc.yaml", sets=("iterations=1",))
    rows = []
    for gpus, microbatches in sizes:
        gpus_per_dc, dp = gpus // 4, gpus // 128
        topology = replace(inputs.topology, datacenters=tuple(
            replace(dc, gpus=gpus_per_dc) for dc in inputs.topology.datacenters))
        _, job = vary(topology, inputs.job, "dp", str(dp))
        _, job = vary(topology, job, "microbatches", str(microbatches))
        policy = training_policy("1f1b")
        plan = plan_with_simulator(policy, topology, job)
        started = time.perf_counter()
        result = Simulator(topology, job, plan, policy).run()
        rows.append({"gpus": gpus, "dp": dp, "microbatches": microbatches,
                     "wall_s": time.perf_counter() - started, "spans": len(result.spans),
                     "events": result.events})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def speed_table(rows: list[dict[str, Any]]) -> str:
    """GPUs down, microbatches across; then the growth exponent at 8 microbatches."""
    columns = sorted({r["microbatches"] for r in rows})
    wall = {(r["gpus"], r["microbatches"]): r["wall_s"] for r in rows}
    lines = ["| GPUs | " + " | ".join(f"{m} microbatches" for m in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for gpus in sorted({r["gpus"] for r in rows}):
        cells = [f"{wall[gpus, m]:.2f} s" if (gpus, m) in wall else "not run" for m in columns]
        lines.append(f"| {gpus:,} | " + " | ".join(cells) + " |")
    base = [r for r in sorted(rows, key=lambda r: r["gpus"])
            if r["microbatches"] == 8 and r["gpus"] >= 4096]
    if len(base) >= 2:
        lines.append(f"\nGrowth at 8 microbatches, {base[0]['gpus']:,} to "
                     f"{base[-1]['gpus']:,} GPUs: wall time ~ GPUs^{_slope(base, 'wall_s'):.2f}, "
                     f"events ~ GPUs^{_slope(base, 'events'):.2f}; per event "
                     + ", ".join(f"{r['wall_s'] / r['events'] * 1e6:.1f} us" for r in base))
    return "\n".join(lines)


def _slope(rows: list[dict[str, Any]], key: str) -> float:
    """The exponent of a power law through (GPUs, rows[key]), least squares in logs."""
    return statistics.linear_regression([math.log(r["gpus"]) for r in rows],
                                        [math.log(r[key]) for r in rows]).slope


def atlas_at(gpus: int, microbatches: int = 8) -> dict[str, Any]:
    """Atlas's plan search and one simulation of its plan at `gpus` (the scale setup)."""
    inputs = load_inputs(ROOT / "topologies" / "gpt3-4dc.yaml", sets=("iterations=2",))
    topology = replace(inputs.topology, datacenters=tuple(
        replace(dc, gpus=gpus // 4) for dc in inputs.topology.datacenters))
    _, job = vary(topology, inputs.job, "dp", str(gpus // 128))
    _, job = vary(topology, job, "microbatches", str(microbatches))
    policy = training_policy("atlas")
    started = time.perf_counter()
    plan = plan_with_simulator(policy, topology, job)
    planned = time.perf_counter()
    summary, _ = simulate_plan(topology, job, plan, policy)
    candidates = plan.notes["dc_selection"]["candidates"]
    row = {"gpus": gpus, "planning_s": planned - started,
           "simulation_s": time.perf_counter() - planned, "iteration_s": summary.median_s,
           "candidates": len(candidates),
           "stopped_early": sum(1 for c in candidates if c.get("at_least"))}
    print(json.dumps(row), flush=True)
    return row


def _sizes(text: str) -> tuple[tuple[int, int], ...]:
    pairs = [size.split("x") for size in text.split(",")]
    return tuple((int(gpus), int(microbatches)) for gpus, microbatches in pairs)


def agreement_table(repeat: int, topologies: list[str]) -> list[dict[str, Any]]:
    from testbed.runtime.coordinator import Coordinator
    from testbed.runtime.signals import run_with_signals

    rows = []
    for name, iterations in (("two-dc", 8), ("paper-3dc", 4)):
        if name not in topologies:
            continue
        for policy_name in ("gpipe", "1f1b"):
            inputs = load_inputs(ROOT / "topologies" / f"{name}.yaml",
                                 sets=(f"iterations={iterations}",))
            policy = training_policy(policy_name)
            plan = plan_with_simulator(policy, inputs.topology, inputs.job)
            emulated, spans = [], []
            for _ in range(repeat):
                with tempfile.TemporaryDirectory() as tmp:
                    coordinator = Coordinator(inputs.topology, inputs.job, plan, policy,
                                              "emulated", Path(tmp), say=lambda _m: None)
                    outcome = asyncio.run(run_with_signals(coordinator))
                emulated.append(outcome.summary.median_s)
                spans += outcome.spans
            modeled, _ = simulate_plan(inputs.topology, inputs.job, plan, policy)
            profiled, _ = simulate_plan(inputs.topology, inputs.job, plan, policy,
                                        profile_from_spans(spans))
            emu = statistics.median(emulated)
            rows.append({"topology": name, "policy": policy_name, "emulated_s": emu,
                         "emulated_runs": emulated, "simulated_s": modeled.median_s,
                         "error": modeled.median_s / emu - 1,
                         "simulated_with_profile_s": profiled.median_s,
                         "error_with_profile": profiled.median_s / emu - 1})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repeat", type=int, default=3, help="emulator runs per case")
    parser.add_argument("--skip-emulator", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--sizes", help="GPUSxMICROBATCHES,... for the speed table "
                        "(default: 128, 1024 and 8192 GPUs with 8, 32 and 128)")
    parser.add_argument("--atlas", type=int, metavar="GPUS",
                        help="also time Atlas's planning and simulation at this many GPUs")
    parser.add_argument("--topologies", default="two-dc,paper-3dc",
                        help="emulator topologies to compare against (comma-separated)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {"scale": [] if args.skip_scale else scale_table(
        _sizes(args.sizes) if args.sizes else DEFAULT_SIZES)}
    if results["scale"]:
        print(speed_table(results["scale"]))
    if args.atlas:
        results["atlas"] = atlas_at(args.atlas)
    if not args.skip_emulator:
        results["agreement"] = agreement_table(args.repeat, args.topologies.split(","))
        print("\n| topology | policy | emulated (median of runs) | runs | simulated | error | "
              "with profile | error |\n|---|---|---|---|---|---|---|---|")
        for r in results["agreement"]:
            runs = ", ".join(f"{x:.3f}" for x in r["emulated_runs"])
            print(f"| {r['topology']} | {r['policy']} | {r['emulated_s']:.3f} s | {runs} | "
                  f"{r['simulated_s']:.3f} s | {r['error']:+.1%} | "
                  f"{r['simulated_with_profile_s']:.3f} s | {r['error_with_profile']:+.1%} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
