#!/usr/bin/env python3
"""BubbleTea's claims in the simulator: GPU utilization with prefill in the bubbles, the
training slowdown against `none`, and TTFT against a dedicated prefill GPU, as load rises.

`.venv/bin/python scripts/bench_bubbles.py [--rates 2,5,10,20,40] [--paper-scale]
 [--json F]`. Prints markdown tables. Every row is one simulated run of the job's
iterations with Atlas on paper-3dc (and, with --paper-scale, GPT-3 on gpt3-4dc with a
7B prefill workload); the slowdown is against the same run with bubble policy `none`: its
tokens/s over the filled run's, minus one, as `compare` has it.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed.experiments.inputs import load_inputs
from testbed.experiments.run import run
from testbed.metrics.summary import speedup
from testbed.run.spec import RunSpec

ROOT = Path(__file__).resolve().parent.parent
BUBBLES = ("none", "greedy", "bubbletea")
PAPER_SCALE_INFERENCE = (
    "inference.model.layers=32", "inference.model.hidden=4096", "inference.model.heads=32",
    "inference.model.kv_heads=1", "inference.model.seq_len=4096",
    "inference.model.vocab=32000", "inference.model.ffn=11008", "inference.model.mlp=swiglu",
    "inference.model.tied_embeddings=false",
    "inference.prompt_length.distribution=uniform", "inference.prompt_length.min=128",
    "inference.prompt_length.max=512", "inference.decode_dc=local", "inference.deadline=10s")


def one(topology: str, policy: str, bubble: str, sets: tuple[str, ...]) -> dict[str, Any]:
    inputs = load_inputs(ROOT / "topologies" / f"{topology}.yaml", sets=sets)
    spec = RunSpec.build("simulate", inputs.topology, inputs.job, policy=policy,
                         bubble_policy=bubble)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = run(spec, Path(tmp) / "run").results
    inference = results["inference"]
    return {
        "bubble": bubble, "iteration_s": results["iteration_time_s"]["median"],
        "tokens_per_s": results["tokens_per_s"],
        "training_util": results["gpu_utilization"]["training"],
        "total_util": results["gpu_utilization"]["total"],
        "requests": inference["requests"], "served": inference["served"],
        "rejected": inference["rejected"],
        "ttft_p50": inference["ttft_s"]["p50"], "ttft_p99": inference["ttft_s"]["p99"],
        "dedicated_p50": inference.get("dedicated", {}).get("ttft_s", {}).get("p50"),
        "dedicated_p99": inference.get("dedicated", {}).get("ttft_s", {}).get("p99"),
        "wall_s": time.perf_counter() - started,
    }


def sweep(topology: str, policy: str, rates: list[float], extra: tuple[str, ...]
          ) -> list[dict[str, Any]]:
    rows = []
    for rate in rates:
        sets = (*extra, f"inference.arrival_rate={rate}")
        reference = None
        for bubble in BUBBLES:
            row = {"topology": topology, "rate": rate, **one(topology, policy, bubble, sets)}
            if bubble == "none":
                reference = row["tokens_per_s"]
            ratio = speedup(reference, row["tokens_per_s"])
            row["slowdown"] = None if ratio is None else ratio - 1
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{x:.1%}"

    def sec(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f} s"

    out = ["| requests/s | bubbles | iteration | slowdown | GPU util (training) | "
           "GPU util (total) | served / arrived | rejected | TTFT p50 | TTFT p99 | "
           "dedicated GPU p50 / p99 |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['rate']:g} | {r['bubble']} | {r['iteration_s']:.3f} s | "
            f"{'-' if r['bubble'] == 'none' else format(r['slowdown'], '+.2%')} | "
            f"{pct(r['training_util'])} | {pct(r['total_util'])} | "
            f"{r['served']} / {r['requests']} | {r['rejected']} | {sec(r['ttft_p50'])} | "
            f"{sec(r['ttft_p99'])} | {sec(r['dedicated_p50'])} / {sec(r['dedicated_p99'])} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rates", default="10,50,100,200,400",
                        help="prefill requests per second (comma-separated)")
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--paper-scale", action="store_true",
                        help="also GPT-3 175B on gpt3-4dc (1,024 GPUs)")
    parser.add_argument("--paper-rates", default="2000,8000",
                        help="requests per second at paper scale")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    results: dict[str, Any] = {"paper-3dc": sweep(
        "paper-3dc", "atlas", rates, (f"iterations={args.iterations}",))}
    print("\n" + table(results["paper-3dc"]))
    if args.paper_scale:
        results["gpt3-4dc"] = sweep("gpt3-4dc", "atlas",
                                    [float(r) for r in args.paper_rates.split(",")],
                                    ("iterations=2", *PAPER_SCALE_INFERENCE))
        print("\n" + table(results["gpt3-4dc"]))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
