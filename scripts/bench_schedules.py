#!/usr/bin/env python3
"""torch's pipeline schedules over the WAN: 1F1B, interleaved 1F1B (2 and 4 stages per
GPU), ZB-V, DualPipeV and Atlas, by iteration time, bubbles, activation memory and what
BubbleTea fills.

`.venv/bin/python scripts/bench_schedules.py [--parts simulate,emulate] [--json F]
[--from-json F] [--readme docs/plans.md] [--only LABEL,...]` (`--parts ''` with `--from-json`
only renders); simulate takes a few minutes, emulate (root) about two minutes a schedule.

- simulate: paper-3dc and wan-3dc in the simulator, and paper-3dc with its WAN links
  at 1 ms and 100 Gbit/s (where compute, not the WAN, bounds the pipeline; the
  topologies' own are WAN-bound at one connection per pair). The schedules run on the
  same 12 GPUs
  in file order, dp 2 x 6 GPUs per pipeline (two per DC, each stage's replicas in one DC,
  24 microbatches), Atlas on its own plan: iteration time, tokens/s, the GPUs' idle share
  over the measured iterations (simulated) and the schedule's own bubble (one iteration,
  equal stages, free messages: testbed.plan.ideal), the most activation memory a GPU
  holds, and the same run with BubbleTea filling bubbles at a high request rate (what it
  adds to GPU utilization, and the training slowdown).
- emulate (root): paper-3dc over the emulated WAN, emulated compute, the same plans;
  a schedule the emulator does not run yet is recorded with its refusal.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from testbed import api
from testbed.errors import InputError
from testbed.experiments.planning import shared_cache
from testbed.experiments.sweep import vary
from testbed.plan.ideal import ideal_bubble_fraction

ROOT = Path(__file__).resolve().parent.parent

SCHEDULES: list[tuple[str, str, dict[str, str]]] = [
    ("1f1b", "1f1b", {}),
    ("interleaved-1f1b x2", "interleaved-1f1b", {"virtual": "2"}),
    ("interleaved-1f1b x4", "interleaved-1f1b", {"virtual": "4"}),
    ("zb-v", "zb-v", {}),
    ("dualpipe-v", "dualpipe-v", {}),
    ("atlas", "atlas", {}),
]
SHAPE = ("dp=2", "pp=6")
"""Every schedule but Atlas's: the same GPUs, two per DC in each pipeline."""
RATE = "400/s"
"""BubbleTea's request rate: enough to fill what bubbles it can (docs/bubbletea.md)."""
ITERATIONS = 3
CONDITIONS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "paper-3dc": ("paper-3dc", ()),
    "wan-3dc": ("wan-3dc", ()),
    "paper-3dc, WAN at 1 ms and 100 Gbit/s": ("paper-3dc", (("wan.latency", "1ms"),
                                                            ("wan.bandwidth", "100Gbit"))),
}
"""What the simulate part runs: a topology file and the knobs turned on it."""


def _inputs(condition: str, label: str, rate: str | None = None) -> api.Inputs:
    topology, knobs = CONDITIONS[condition]
    sets = [f"iterations={ITERATIONS}"] + ([] if label == "atlas" else list(SHAPE))
    if rate is not None:
        sets.append(f"inference.arrival_rate={rate}")
    inputs = api.load(ROOT / "topologies" / f"{topology}.yaml",
                      sets=dict(s.split("=", 1) for s in sets))
    for key, value in knobs:
        changed, job = vary(inputs.topology, inputs.job, key, value)
        inputs = replace(inputs, topology=changed, job=job)
    return inputs


def _row(result: api.Result) -> dict[str, Any]:
    results, plan = result.results, result.record.plan
    memory = results["memory"].values()
    chosen = (plan.notes.get("dc_selection") or {}).get("chosen", {})
    return {
        "plan": {"dp": plan.dp, "gpus_per_pipeline": plan.gpus_per_pipeline,
                 "stages_per_gpu": plan.stages_per_gpu, "microbatches": plan.microbatches,
                 "schedule": chosen.get("schedule", plan.policy)},
        "iteration_s": results["iteration_time_s"]["median"],
        "tokens_per_s": results["tokens_per_s"],
        "idle": 1 - results["gpu_utilization"]["training"],
        "ideal_bubble": ideal_bubble_fraction(plan),
        "peak_activations_bytes": max(m["activations_bytes"] for m in memory),
        "peak_memory_bytes": max(m["total_bytes"] for m in memory),
        "wan_bytes_per_iteration": results["wan"]["bytes"] / results["iterations"],
    }


def simulate_part(work: Path, only: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    with shared_cache():  # Atlas plans once for its two runs
        for topology in CONDITIONS:
            rows: dict[str, Any] = {}
            for label, policy, options in SCHEDULES:
                if only and label not in only:
                    continue
                where = work / topology.replace(" ", "_") / label.replace(" ", "_")
                alone = api.simulate(_inputs(topology, label), policy, options,
                                     out=where / "none")
                row = _row(alone)
                filled = api.simulate(_inputs(topology, label, RATE), policy, options,
                                      bubble="bubbletea", out=where / "bubbletea").results
                inference = filled["inference"]
                row["bubbletea"] = {
                    "rate": RATE,
                    "utilization_total": filled["gpu_utilization"]["total"],
                    "gain": filled["gpu_utilization"]["total"] - (1 - row["idle"]),
                    "slowdown": row["tokens_per_s"] / filled["tokens_per_s"] - 1,
                    "served": inference["served"], "requests": inference["requests"],
                }
                rows[label] = row
                print(f"{topology} {label}: {row['iteration_s']:.3f} s, idle "
                      f"{row['idle']:.1%} (ideal {row['ideal_bubble']:.1%}), BubbleTea "
                      f"+{row['bubbletea']['gain']:.1%}", flush=True)
            base = rows.get("1f1b")
            for row in rows.values():
                row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"] if base else None
            out[topology] = rows
    return out


def emulate_part(work: Path, only: list[str]) -> dict[str, Any]:
    """paper-3dc over the emulated WAN (emulated compute): each schedule's run, or the
    reason the emulator refused it before anything started."""
    out: dict[str, Any] = {}
    for label, policy, options in SCHEDULES:
        if only and label not in only:
            continue
        inputs = _inputs("paper-3dc", label)
        try:
            result = api.emulate(inputs, policy, options, compute="emulated",
                                 out=work / label.replace(" ", "_"), say=lambda _m: None)
        except InputError as exc:
            out[label] = {"refused": str(exc)}
            print(f"{label}: refused: {exc}", flush=True)
            continue
        row = _row(result)
        row["machine_bound"] = (result.results.get("emulation") or {}).get("cpu_bound")
        row["predicted_iteration_s"] = result.results.get("predicted_iteration_s")
        out[label] = row
        print(f"{label}: {row['iteration_s']:.3f} s emulated, idle {row['idle']:.1%}",
              flush=True)
    return out


def _plan(row: dict[str, Any]) -> str:
    plan = row["plan"]
    stages = "" if plan["stages_per_gpu"] == 1 else f", {plan['stages_per_gpu']} stages each"
    return f"dp {plan['dp']} x {plan['gpus_per_pipeline']} GPUs{stages}"


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.1f} GiB"


def _change(fraction: float) -> str:
    """A slowdown as a signed percentage; rounding noise of a ratio reads as none."""
    return "0.00%" if abs(fraction) < 5e-5 else f"{fraction:+.2%}"


def tables(report: dict[str, Any]) -> str:
    """The documentation's tables, from the benchmark's JSON alone."""
    lines: list[str] = []
    for topology, rows in report.get("simulate", {}).items():
        lines += [f"{topology}, simulated:", "",
                  "| schedule | plan | iteration | tokens/s (x 1f1b) | idle (simulated) | "
                  "bubble (ideal) | peak activations per GPU (all memory) | BubbleTea "
                  "fills | BubbleTea slowdown |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for label, row in rows.items():
            name = label if label != "atlas" else f"atlas ({row['plan']['schedule']})"
            speedup = f" ({row['speedup']:.2f}x)" if row.get("speedup") else ""
            tea = row["bubbletea"]
            lines.append(
                f"| {name} | {_plan(row)} | {row['iteration_s']:.2f} s | "
                f"{row['tokens_per_s']:,.0f}{speedup} | {row['idle']:.1%} | "
                f"{row['ideal_bubble']:.1%} | {_gib(row['peak_activations_bytes'])} "
                f"({_gib(row['peak_memory_bytes'])}) | +{tea['gain']:.1%} | "
                f"{_change(tea['slowdown'])} |")
        lines.append("")
    emulated = report.get("emulate")
    if emulated:
        lines += ["paper-3dc, emulated (emulated compute, dilation 1, one run each):", "",
                  "| schedule | plan | iteration (simulated) | idle | machine-bound |",
                  "| --- | --- | --- | --- | --- |"]
        for label, row in emulated.items():
            if "refused" in row:
                lines.append(f"| {label} | not run yet by the emulator | | | |")
                continue
            predicted = row.get("predicted_iteration_s")
            bound = {True: "yes", False: "no"}.get(row.get("machine_bound"), "-")
            lines.append(f"| {label} | {_plan(row)} | {row['iteration_s']:.2f} s"
                         + (f" ({predicted:.2f} s)" if predicted else "")
                         + f" | {row['idle']:.1%} | {bound} |")
    return "\n".join(lines).rstrip()


def write_readme(page: Path, report: dict[str, Any], source: Path | None) -> None:
    """The tables into `page` (docs/...) between its markers, stamped with the commit
    of `source`, the JSON it came from (scripts/docs_tables.py does the same from the JSON)."""
    from docs_tables import write_block

    write_block(page, "schedules", tables(report), [] if source is None else [source])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="simulate")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only", default="",
                        help="comma-separated schedule labels to run (default: all)")
    parser.add_argument("--from-json", type=Path,
                        help="start from this report (parts not run keep its figures)")
    parser.add_argument("--readme", type=Path, metavar="PAGE.md",
                        help="rewrite the tables between the markers of this page "
                        "(docs/plans.md)")
    args = parser.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    only = [label for label in args.only.split(",") if label]
    report: dict[str, Any] = json.loads(args.from_json.read_text()) if args.from_json else {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "simulate" in parts:
            report["simulate"] = simulate_part(work / "simulate", only)
        if "emulate" in parts:
            report["emulate"] = {**report.get("emulate", {}),
                                 **emulate_part(work / "emulate", only)}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.readme:
        write_readme(args.readme, report, args.json or args.from_json)


if __name__ == "__main__":
    main()
