#!/usr/bin/env python3
"""Atlas's plan search against a brute force, on the shipped topologies and constructed
cases (asymmetric DCs, mixed GPU types, a far thin DC, a high-BDP link, 4 DCs x 16 GPUs).

For each case: Atlas's staged search (its default) against a brute force, `search=grid`
(every DC subset, dp, pp and schedule simulated, with Atlas's mechanisms on), each plan's
iteration time from a full simulation, planning time, and Atlas's distance from its
lower bound.

`.venv/bin/python scripts/bench_atlas_search.py [--cases a,b] [--json F]`
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator, shared_cache
from testbed.job.load import parse_job
from testbed.job.model import Job
from testbed.policy import training_policy
from testbed.sim.simulate import simulate_plan
from testbed.topology import dump_topology, load_topology, parse_topology
from testbed.topology.model import Topology

ROOT = Path(__file__).resolve().parent.parent
PAPER_JOB = {"model": {"layers": 40, "hidden": 5120, "heads": 40, "seq_len": 2048,
                       "vocab": 50257}, "microbatch_size": 1, "global_batch": 48,
             "iterations": 4}


def shipped(name: str) -> Callable[[], tuple[Topology, Job]]:
    def build() -> tuple[Topology, Job]:
        inputs = load_inputs(ROOT / "topologies" / f"{name}.yaml")
        return inputs.topology, inputs.job
    return build


def paper_variant(change: Callable[[dict[str, Any]], None], job: dict[str, Any] | None = None
                  ) -> Callable[[], tuple[Topology, Job]]:
    def build() -> tuple[Topology, Job]:
        data = dump_topology(load_topology(ROOT / "topologies" / "paper-3dc.yaml"))
        data.pop("job", None)
        data.pop("events", None)
        change(data)
        topology = parse_topology(data, "constructed.yaml")
        return topology, parse_job(job or PAPER_JOB, "constructed.yaml")
    return build


def asymmetric(data: dict[str, Any]) -> None:
    for dc, gpus in zip(data["datacenters"], (8, 4, 2), strict=True):
        dc["gpus"] = gpus


def mixed_gpus(data: dict[str, Any]) -> None:
    for dc, gpu in zip(data["datacenters"], ("h100", "a100", "v100"), strict=True):
        dc["gpu"] = gpu


def far_thin_dc(data: dict[str, Any]) -> None:
    data["datacenters"].append({"name": "far", "gpus": 4, "gpu": "a100",
                                "bandwidth": "100Gbit", "latency": "50us"})
    data["wan"].append({"between": ["west", "far"], "latency": "150ms",
                        "bandwidth": "100Mbit"})


def high_bdp() -> tuple[Topology, Job]:
    """Two DCs of 8 H100s across one 10 Gbit/s link of 100 ms round trip, a 70B model."""
    topology = parse_topology({
        "datacenters": [{"name": n, "gpus": 8, "gpu": "h100", "bandwidth": "400Gbit",
                         "latency": "5us"} for n in ("east", "west")],
        "wan": [{"between": ["east", "west"], "latency": "50ms", "bandwidth": "10Gbit"}],
    }, "high-bdp.yaml")
    job = parse_job({"model": "llama2-70b", "microbatch_size": 2, "global_batch": 64,
                     "iterations": 3}, "high-bdp.yaml")
    return topology, job


def four_dc_64() -> tuple[Topology, Job]:
    """Four DCs of 16 A100s (64 GPUs), 1-2 Gbit/s links of 15-40 ms."""
    names = ("east", "central", "west", "north")
    links = [("east", "central", 15, 2), ("central", "west", 25, 1), ("east", "west", 40, 1),
             ("central", "north", 20, 2), ("east", "north", 30, 1), ("west", "north", 35, 1)]
    topology = parse_topology({
        "tcp": {"congestion": "cubic", "rmem": ["4KiB", "128KiB", "6MiB"],
                "wmem": ["4KiB", "16KiB", "4MiB"]},
        "datacenters": [{"name": n, "gpus": 16, "gpu": "a100", "bandwidth": "100Gbit",
                         "latency": "50us"} for n in names],
        "wan": [{"between": [a, b], "latency": f"{ms}ms", "bandwidth": f"{g}Gbit"}
                for a, b, ms, g in links],
    }, "four-dc-64.yaml")
    job = parse_job({**PAPER_JOB, "global_batch": 64}, "four-dc-64.yaml")
    return topology, job


CASES: dict[str, Callable[[], tuple[Topology, Job]]] = {
    "two-dc": shipped("two-dc"),
    "paper-3dc": shipped("paper-3dc"),
    "gpt3-4dc": shipped("gpt3-4dc"),
    "asymmetric-8-4-2": paper_variant(asymmetric),
    "mixed-h100-a100-v100": paper_variant(mixed_gpus),
    "far-thin-dc": paper_variant(far_thin_dc),
    "high-bdp-70b": high_bdp,
    "four-dc-64": four_dc_64,
}


def measure(topology: Topology, job: Job, search: str) -> dict[str, Any]:
    policy = training_policy("atlas", {"search": search})
    began = time.monotonic()
    with shared_cache():
        plan = plan_with_simulator(policy, topology, job)
    planning = time.monotonic() - began
    summary, _ = simulate_plan(topology, job, plan, policy)
    chosen = plan.notes["dc_selection"]["chosen"]
    return {"iteration_s": summary.median_s, "planning_s": round(planning, 2),
            "simulated_plans": len(plan.notes["dc_selection"]["candidates"]),
            "plan": chosen, "lower_bound_s": plan.notes["lower_bound_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help="comma-separated: "
                        + ", ".join(CASES))
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()
    rows = []
    print("| case | Atlas (s) | grid (s) | Atlas / grid | Atlas / bound | planning (s) |"
          " grid planning (s) | Atlas's plan |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.cases.split(","):
        topology, job = CASES[name]()
        staged = measure(topology, job, "staged")
        brute = measure(topology, job, "grid")
        p = staged["plan"]
        row = {"case": name, "staged": staged, "grid": brute,
               "ratio_to_grid": staged["iteration_s"] / brute["iteration_s"],
               "ratio_to_bound": staged["iteration_s"] / staged["lower_bound_s"]}
        rows.append(row)
        cell = p["dp_cell"] if p["temporal"] else "fair"
        print(f"| {name} | {staged['iteration_s']:.4g} | {brute['iteration_s']:.4g} | "
              f"{row['ratio_to_grid']:.3f} | {row['ratio_to_bound']:.2f} | "
              f"{staged['planning_s']:.1f} | {brute['planning_s']:.1f} | "
              f"{'+'.join(p['dcs'])} dp {p['dp']} x pp {p['pp']} {p['schedule']} "
              f"cell {cell} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(sys.argv), "cases": rows},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
