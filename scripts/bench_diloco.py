#!/usr/bin/env python3
"""The DiLoCo family against every-step data parallelism and Atlas, by tokens per second
(and, emulated with real compute, by time to a target loss).

`.venv/bin/python scripts/bench_diloco.py [--parts simulate,bandwidth,emulate] [--json F]`.

- simulate: paper-3dc and wan-3dc in the simulator: tokens/s, WAN bytes per inner step,
  and the cycle time of dp-across-dc, diloco (H = 10, 50, 500), streaming-diloco
  (4-bit, the paper's fragments of 3 blocks, overlap 1), dp-compressed (int8) and Atlas.
- bandwidth: paper-3dc with every WAN link at 0.1 to 100 Gbit/s: which method leads.
- emulate (root): two-dc with real compute on this CPU, the same tokens and seed for
  every method: loss against represented time, time to a target loss, WAN bytes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from testbed import api
from testbed.sim.sweep import vary

ROOT = Path(__file__).resolve().parent.parent

METHODS: list[tuple[str, str, dict[str, str]]] = [
    ("dp-across-dc", "dp-across-dc", {}),
    ("dp-compressed int8", "dp-compressed", {"payload": "int8"}),
    ("diloco H=10", "diloco", {"inner_steps": "10"}),
    ("diloco H=50", "diloco", {"inner_steps": "50"}),
    ("diloco H=500", "diloco", {"inner_steps": "500"}),
    ("streaming-diloco", "streaming-diloco", {"outer_bits": "4"}),
    ("atlas", "atlas", {}),
]


def _simulated(inputs: api.Inputs, policy: str, options: dict[str, str],
               out: Path) -> dict[str, Any]:
    """One simulated run of at least two whole cycles (the first iteration is warm-up)."""
    plan = api.plan(inputs, policy, options)
    iterations = max(inputs.job.iterations, plan.period + 1)
    job = replace(inputs.job, iterations=iterations)
    result = api.simulate(replace(inputs, job=job), policy, options, out=out)
    results = result.results
    return {
        "tokens_per_s": results["tokens_per_s"],
        "iterations": results["iterations"],
        "period": plan.period,
        "wan_bytes_per_step": results["wan"]["bytes"] / results["iterations"],
        "cycle_s": (results.get("cycle_time_s") or {}).get("mean"),
        "gpu_utilization": results["gpu_utilization"]["training"],
    }


def simulate_part(work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for topology in ("paper-3dc", "wan-3dc"):
        inputs = api.load(ROOT / "topologies" / f"{topology}.yaml")
        rows = {}
        for label, policy, options in METHODS:
            rows[label] = _simulated(inputs, policy, options, work / topology / label)
            print(f"{topology} {label}: {rows[label]['tokens_per_s']:.0f} tokens/s, "
                  f"{rows[label]['wan_bytes_per_step'] / 1e9:.2f} GB on the WAN per step",
                  flush=True)
        base = rows["dp-across-dc"]
        for row in rows.values():
            row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"]
            row["wan_bytes_vs_dp"] = row["wan_bytes_per_step"] / base["wan_bytes_per_step"]
        out[topology] = rows
    return out


def bandwidth_part(work: Path, rates: tuple[str, ...] = ("100Mbit", "1Gbit", "10Gbit",
                                                         "100Gbit")) -> dict[str, Any]:
    inputs = api.load(ROOT / "topologies" / "paper-3dc.yaml")
    out: dict[str, Any] = {}
    for rate in rates:
        topology, job = vary(inputs.topology, inputs.job, "wan.bandwidth", rate)
        at = replace(inputs, topology=topology, job=job)
        rows = {label: _simulated(at, policy, options, work / rate / label)["tokens_per_s"]
                for label, policy, options in METHODS}
        leader = max(rows, key=lambda label: rows[label] or 0.0)
        print(f"WAN {rate}: {leader} leads ({rows[leader]:.0f} tokens/s)", flush=True)
        out[rate] = {"tokens_per_s": rows, "leader": leader}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="simulate,bandwidth")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    parts = args.parts.split(",")
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "simulate" in parts:
            report["simulate"] = simulate_part(work / "simulate")
        if "bandwidth" in parts:
            report["bandwidth"] = bandwidth_part(work / "bandwidth")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
