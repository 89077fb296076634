#!/usr/bin/env python3
"""Atlas's effects, measured: multiple connections, temporal sharing, DC selection and
scaling, against the baselines, in the simulator and (as root) over the emulated WAN.

`.venv/bin/python scripts/bench_atlas.py [--parts transfer,scaling,bound,perturb,compare]
 [--emulate] [--repeat K] [--json F]`. Prints markdown tables; `compare` runs
`testbed compare` on paper-3dc (all policies, and temporal sharing alone at dp 4 x pp 3,
windows warm and cold) and keeps each row's figures (benchmarks/atlas-compare.json, the
Atlas page's tables). Without `--emulate`, `compare` keeps the emulated runs F already
holds (and the commit they were measured at, as `emulated_commit`) beside the new
simulated ones.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from measured_at import commit
from testbed_plugins.atlas.estimate import connections_to_fill

from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.metrics.summary import summarize
from testbed.plan.host_limits import this_machine
from testbed.plan.interpret import Compute
from testbed.policy import training_policy
from testbed.sim.one_transfer import one_transfer_s
from testbed.sim.simulate import simulate_plan
from testbed.sim.simulator import Simulator
from testbed.topology import parse_topology

ROOT = Path(__file__).resolve().parent.parent
os.environ["TESTBED_PLANNING_STORE"] = "off"  # every search timed as a first: none read back
ACTIVATION = 1 * 2048 * 5120 * 2  # paper-3dc's microbatch at a stage boundary (bf16)


def pair_topology(one_way_ms: float) -> Any:
    return parse_topology({
        "tcp": {"congestion": "cubic"},
        "datacenters": [{"name": "east", "gpus": 1}, {"name": "west", "gpus": 1}],
        "wan": [{"between": ["east", "west"], "latency": f"{one_way_ms}ms",
                 "bandwidth": "1Gbit"}]}, "bench")


def simulated_transfer(one_way_ms: float, connections: int, warm: bool) -> float:
    return one_transfer_s(pair_topology(one_way_ms), "east", "west", ACTIVATION, connections,
                          warm)


def emulated_transfers(one_way_ms: float, connections: int, messages: int) -> list[float]:
    from testbed.emulator.net.network import bring_up, tear_down
    from testbed.emulator.runtime.coordinator.probe import timed_messages
    from testbed.plan.pacing import paced

    topology = pair_topology(one_way_ms)
    # paced as a run would pace this pair (testbed.plan.pacing)
    pace = topology.link("east", "west").bandwidth_bps \
        if paced(topology, "east", "west", ACTIVATION) else 0.0
    network = bring_up(topology)
    try:
        return timed_messages(network, "east-0", "west-0", connections, messages, ACTIVATION,
                              pace)
    finally:
        tear_down(network)


def transfer_table(emulate: bool) -> list[dict[str, Any]]:
    rows = []
    for one_way in (20, 50, 100):
        n = connections_to_fill(pair_topology(one_way), "east", "west", this_machine())
        row: dict[str, Any] = {"one_way_ms": one_way, "atlas_connections": n,
                               "sim_1_cold_s": simulated_transfer(one_way, 1, False),
                               "sim_n_cold_s": simulated_transfer(one_way, n, False),
                               "sim_1_warm_s": simulated_transfer(one_way, 1, True),
                               "sim_n_warm_s": simulated_transfer(one_way, n, True)}
        if emulate:
            one = emulated_transfers(one_way, 1, 4)
            many = emulated_transfers(one_way, n, 4)
            row.update({"emu_1_first_s": one[0], "emu_n_first_s": many[0],
                        "emu_1_later_s": statistics.median(one[1:]),
                        "emu_n_later_s": statistics.median(many[1:])})
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def scaling_table() -> list[dict[str, Any]]:
    """Tokens/s as DCs of four A100s join a ring of 20-40 ms links, paper-3dc's job."""
    names = ["east", "central", "west", "north", "south", "dc6"]
    rows = []
    base = load_inputs(ROOT / "topologies" / "paper-3dc.yaml")
    for count in range(1, len(names) + 1):
        used = names[:count]
        links = [{"between": [a, b], "latency": f"{20 + 5 * (i % 4)}ms", "bandwidth": "1Gbit"}
                 for i, (a, b) in enumerate(itertools.pairwise(used))]
        if count > 2:
            links.append({"between": [used[-1], used[0]], "latency": "40ms",
                          "bandwidth": "1Gbit"})
        topology = parse_topology({
            "tcp": {"congestion": "cubic"},
            "datacenters": [{"name": n, "gpus": 4, "gpu": "a100", "bandwidth": "100Gbit"}
                            for n in used], "wan": links}, f"ring-{count}")
        row: dict[str, Any] = {"dcs": count, "gpus": 4 * count}
        for name in ("gpipe", "atlas"):
            policy = training_policy(name)
            try:
                plan = plan_with_simulator(policy, topology, base.job)
                summary, _ = simulate_plan(topology, base.job, plan, policy)
                row[f"{name}_tokens_per_s"] = summary.tokens_per_s
                row[f"{name}_plan"] = f"dp {plan.dp} x pp {plan.pp}"
            except Exception as exc:  # a baseline that cannot place the job here
                row[f"{name}_tokens_per_s"] = None
                row[f"{name}_plan"] = str(exc).split(": ")[-1][:60]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def bound_table() -> list[dict[str, Any]]:
    rows = []
    for name in ("two-dc", "paper-3dc", "gpt3-4dc"):
        inputs = load_inputs(ROOT / "topologies" / f"{name}.yaml")
        policy = training_policy("atlas")
        plan = plan_with_simulator(policy, inputs.topology, inputs.job)
        summary, _ = simulate_plan(inputs.topology, inputs.job, plan, policy)
        bound = plan.notes["lower_bound_s"]
        rows.append({"topology": name, "atlas_s": summary.median_s, "lower_bound_s": bound,
                     "ratio": summary.median_s / bound if bound else None,
                     "plan": f"dp {plan.dp} x pp {plan.pp}"})
        print(json.dumps(rows[-1]), flush=True)
    return rows


class DelayedCompute(Simulator):
    """Every forward and backward held longer by a random fraction up to `scale`."""

    def __init__(self, *args: Any, seed: int, scale: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rng, self.scale = random.Random(seed), scale

    def compute_s(self, compute: Compute) -> float:
        return super().compute_s(compute) * (1 + self.scale * self.rng.random())


def perturb_table(seeds: int = 4) -> list[dict[str, Any]]:
    """Atlas on gpt3-4dc with random extra compute: iteration time against the undisturbed
    plan, with windows kept warm (Atlas's default) and cold."""
    inputs = load_inputs(ROOT / "topologies" / "gpt3-4dc.yaml", sets=("iterations=3",))
    rows = []
    for warm in ("on", "off"):
        policy = training_policy("atlas", {"warm": warm})
        plan = plan_with_simulator(policy, inputs.topology, inputs.job)

        def iteration_s(simulator: Simulator, plan: Any = plan) -> float:
            spans = simulator.run().spans
            return float(summarize(spans, plan.used_gpus(), 0.0, 1, 1.0).median_s or 0.0)

        base = iteration_s(Simulator(inputs.topology, inputs.job, plan, policy))
        for scale in (0.02, 0.1, 0.3):
            ratios = [iteration_s(DelayedCompute(inputs.topology, inputs.job, plan, policy,
                                                 seed=seed, scale=scale)) / base
                      for seed in range(seeds)]
            rows.append({"warm": warm, "schedule": plan.notes["dc_selection"]["chosen"][
                "schedule"], "base_s": base, "extra_compute_up_to": scale, "ratios": ratios})
            print(json.dumps(rows[-1]), flush=True)
    return rows


COMPARED = ("combo", "runs", "failed", "iteration_s", "iteration_low", "iteration_high",
            "speedup", "tokens_per_s", "util_training", "wan_util", "dilation", "machine_bound")
"""What each row of `testbed compare`'s compare.json keeps here."""


def compare(backend: str, repeat: int, out: Path, extra: list[str]) -> list[dict[str, Any]]:
    """`testbed compare` on paper-3dc: its printed table, and its rows' figures."""
    args = [sys.executable, "-c", "from testbed.cli.main import main; main()", "compare",
            str(ROOT / "topologies" / "paper-3dc.yaml"), "--backend", backend, "--repeat",
            str(repeat), "--out", str(out), "--force", *extra]
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    print(result.stdout, result.stderr[-2000:], flush=True)
    if result.returncode:
        raise SystemExit(f"testbed compare failed: {result.stderr.strip()[-500:]}")
    rows = json.loads((out / "compare.json").read_text())["rows"]
    return [{key: row[key] for key in COMPARED} for row in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--parts", default="transfer,scaling,bound,compare")
    parser.add_argument("--emulate", action="store_true", help="also over the emulator (root)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-atlas"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    parts = args.parts.split(",")
    results: dict[str, Any] = {}
    if "transfer" in parts:
        results["transfer"] = transfer_table(args.emulate)
    if "scaling" in parts:
        results["scaling"] = scaling_table()
    if "bound" in parts:
        results["bound"] = bound_table()
    if "perturb" in parts:
        results["perturb"] = perturb_table()
    if "compare" in parts:
        policies = ["-p", "gpipe", "-p", "1f1b", "-p", "atlas", "-p", "atlas-no-multiconn",
                    "-p", "atlas-no-temporal", "-p", "atlas-no-selection"]
        backends = ["simulate"] + (["emulate"] if args.emulate else [])
        for backend in backends:
            everything = policies + (["-p", "dp-across-dc"] if backend == "simulate" else [])
            results[f"compare_{backend}"] = compare(
                backend, args.repeat if backend == "emulate" else 1,
                args.out / f"all-{backend}", everything)
            for warm in ("on", "off"):  # windows kept warm between turns, or not
                results[f"temporal_{backend}_warm_{warm}"] = compare(
                    backend, args.repeat if backend == "emulate" else 1,
                    args.out / f"temporal-{backend}-warm-{warm}",
                    ["-p", "atlas-no-temporal", "-p", "atlas", "--dp", "4", "--pp", "3",
                     "-o", f"warm={warm}"])
    if args.json:
        results["commit"] = commit()
        if "compare" in parts and not args.emulate and args.json.exists():
            kept = json.loads(args.json.read_text())
            emulated = {k: v for k, v in kept.items() if "_emulate" in k}
            if emulated:
                results.update(emulated)
                results["emulated_commit"] = kept.get("emulated_commit", kept.get("commit"))
        args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
