#!/usr/bin/env python3
"""Streaming DiLoCo's compute-utilization simulation rebuilt in this simulator: the WAN
bandwidth each method needs to reach 50, 80, 90, 95 and 99% compute utilization at 1B,
10B and 100B parameters (Douillard et al., "Streaming DiLoCo with overlapping
communication", arXiv 2501.18512v1, Table 4) and the slow-down at 1 Gbit/s against
unlimited bandwidth of its Table 1, cell by cell against the paper's.

`.venv/bin/python scripts/bench_streaming_table.py [--parts table,table1,overlap-simulate,
overlap-emulate]
[--json benchmarks/streaming-table.json] [--from-json F]` (`--parts ''` with
`--from-json` only prints); `table` and `table1` simulate (minutes), `overlap-emulate`
emulates (root).

- table: every cell of Table 4. Each method runs in the simulator at the paper's step
  time (the job's `compute_time`), its gradients or outer gradients reduced in one bucket
  per layer from inside the backward (the paper's DAG has a reduction node per layer),
  syncs ordered first layers first, FP4 (E3M0) where the paper sends it. A cell is the
  least bandwidth of the paper's grid at which the simulated compute utilization (compute
  time over wall time, over a whole cycle of H steps) reaches the target.
- table1: Table 1's ratio, hours at 1 Gbit/s over hours at unlimited bandwidth, for
  data parallelism and Streaming DiLoCo with overlapped FP4 communication at 1B.
- overlap-simulate, overlap-emulate: data parallelism on paper-3dc with its gradients
  reduced in DDP's buckets from inside the backward against one all-reduce after it, in
  the simulator and in the emulator (emulated compute), and how far the two backends
  agree on the time the buckets save.

Every assumption the paper leaves open is stated in the JSON (`assumptions`).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.experiments.planning import plan_with_simulator
from testbed.job.model import ComputeTime, Job, ModelShape
from testbed.metrics.summary import iteration_ends
from testbed.plan.buckets import DDP_BUCKET_MB
from testbed.plan.tcp_model import PAYLOAD_EFFICIENCY
from testbed.policy import training_policy
from testbed.sim.simulator import Simulator
from testbed.topology import parse_topology

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ("Douillard et al., Streaming DiLoCo with overlapping communication: Towards a "
          "Distributed Free Lunch, arXiv 2501.18512v1 (2025): Table 4 (appendix) and "
          "Table 1, section 3.1")
TARGETS = (0.50, 0.80, 0.90, 0.95, 0.99)
GRID = tuple(10 ** (-1 + 4 * k / 49) for k in range(50))
"""The paper's bandwidths (Gbit/s): its cells step by 10^(4/49) (x1.2068), as
numpy.logspace(-1, 3, 50) does; each cell is the grid point it names (`paper_grid_index`)."""

SIZES: dict[str, tuple[float, int, float, int]] = {
    # name: parameters, layers and step time (Table 4), model width chosen here
    "1B": (1e9, 24, 0.1, 2048),
    "10B": (1e10, 48, 0.8, 4096),
    "100B": (1e11, 108, 4.9, 8192),
}
INNER_STEPS = 100
"""H for every DiLoCo variant (Table 4's caption)."""
LAYERS_PER_FRAGMENT = 3
"""Streaming DiLoCo's fragments (Table 4's caption), strided as the paper chooses."""
BUCKETS_PER_LAYER = 8
"""Buckets each layer's (outer) gradients are reduced in (`layer_bucket_mb`)."""

METHODS: dict[str, tuple[str, dict[str, str]]] = {
    "Data-Parallel": ("dp-across-dc", {}),
    "Vanilla DiLoCo": ("diloco", {"inner_steps": str(INNER_STEPS), "outer_bits": "16",
                                  "sync_order": "first-layers"}),
    "Streaming DiLoCo": ("streaming-diloco", {"inner_steps": str(INNER_STEPS),
                                              "overlap": "0", "outer_bits": "16",
                                              "sync_order": "first-layers"}),
    "Streaming DiLoCo w/ overlapped com.": (
        "streaming-diloco", {"inner_steps": str(INNER_STEPS), "overlap": "1",
                             "outer_bits": "16", "sync_order": "first-layers"}),
    "Streaming DiLoCo w/ overlapped FP4 com.": (
        "streaming-diloco", {"inner_steps": str(INNER_STEPS), "overlap": "1",
                             "outer_bits": "4", "sync_order": "first-layers"}),
}

PAPER_TABLE4: dict[str, dict[str, tuple[float, ...]]] = {
    "1B": {
        "Data-Parallel": (86.8, 152.6, 184.2, 222.3, 569.0),
        "Vanilla DiLoCo": (1.4, 6.2, 13.3, 23.3, 86.8),
        "Streaming DiLoCo": (1.4, 5.2, 9.1, 16.0, 28.1),
        "Streaming DiLoCo w/ overlapped com.": (1.4, 4.3, 6.2, 9.1, 11.0),
        "Streaming DiLoCo w/ overlapped FP4 com.": (0.4, 0.9, 1.7, 2.0, 3.0),
    },
    "10B": {
        "Data-Parallel": (104.8, 222.3, 222.3, 268.3, 471.5),
        "Vanilla DiLoCo": (1.7, 7.5, 16.0, 33.9, 104.8),
        "Streaming DiLoCo": (1.7, 5.2, 9.1, 13.3, 19.3),
        "Streaming DiLoCo w/ overlapped com.": (1.7, 3.6, 5.2, 6.2, 7.5),
        "Streaming DiLoCo w/ overlapped FP4 com.": (0.4, 0.9, 1.4, 1.4, 1.7),
    },
    "100B": {
        "Data-Parallel": (184.2, 323.8, 390.7, 390.7, 471.5),
        "Vanilla DiLoCo": (3.0, 11.0, 23.3, 49.4, 184.2),
        "Streaming DiLoCo": (2.4, 6.2, 9.1, 11.0, 19.3),
        "Streaming DiLoCo w/ overlapped com.": (1.7, 3.6, 4.3, 5.2, 5.2),
        "Streaming DiLoCo w/ overlapped FP4 com.": (0.5, 0.9, 1.1, 1.1, 1.4),
    },
}
"""Table 4: Gbit/s to reach each compute utilization, as printed."""

PAPER_TABLE1: dict[str, list[tuple[str, float, float]]] = {
    "Data-Parallel": [("25B", 0.67, 109.0), ("100B", 2.7, 438.0), ("250B", 6.75, 1097.0)],
    "Streaming DiLoCo w/ overlapped FP4 com.": [("25B", 0.67, 0.88), ("100B", 2.7, 3.5),
                                                ("250B", 6.75, 8.75)],
}
"""Table 1 (1B on Dolma): token budget, hours with unlimited bandwidth, hours at 1
Gbit/s."""

WORKERS = 2
LATENCY = "1us"
TCP_BUFFER = "4GiB"
UNLIMITED_GBIT = 5e5
"""Table 1's unlimited bandwidth: 500 Tbit/s, where no sync waits."""
TARGET_RATIO = (0.92, 1.08)
WORST_CELL = 1.25

ASSUMPTIONS: dict[str, str] = {
    "workers": f"{WORKERS} workers (DiLoCo replicas), one per datacenter, each one GPU holding "
               "the whole model: the paper trains with 2 replicas (section 3.2) and its "
               "simulation counts only the bandwidth between datacenters (section 3.1's "
               "remark); the datacenters' own links are 1000 Tbit/s.",
    "parameters": "Exactly 1e9, 1e10 and 1e11 parameters spread evenly over the table's 24, "
                  "48 and 108 layers (the paper's DAG has one node per layer and none for "
                  "embeddings or the output layer): a GELU block of width 2048, 4096 and 8192 "
                  "whose MLP width makes the block N/L parameters, a vocabulary of 256 so "
                  "that the embeddings and output layer hold under 0.1% of the parameters and "
                  "compute.",
    "step time": "The table's step time (0.1, 0.8 and 4.9 s), a worker's forward and "
                 "backward of its whole step, as the job's compute_time; the backward is "
                 "twice the forward; no optimizer time.",
    "payload": "Gradients and outer gradients in bf16 (16 bits; the overlapped FP4 row needs "
               "about a quarter of the overlapped bf16 row's bandwidth in the paper), FP4 "
               "(E3M0) for the FP4 row, with an fp32 scale per 256 values (4.125 bits a "
               "parameter; the paper does not say how it scales its E3M0 values), "
               "quantized once and gathered; a 2-member ring all-reduce, or gather, moves "
               "each worker's whole payload once each way.",
    "buckets": f"{BUCKETS_PER_LAYER} buckets per layer: (outer) gradients start their "
               "all-reduce as the backward has them (the paper: 'the reduction of gradients "
               "or outer gradients is overlapped over the backward pass'; its DAG has a "
               "reduction node per layer). A bucket here is an even share of a collective's "
               "values and waits for the last layer it touches: with one a layer, the last "
               "two would wait for the backward's end; with eighths, 1.125 layers' worth do "
               "where the paper's DAG leaves one layer's. One TCP connection per pair of "
               "workers (its messages in order), syncs ordered first layers first.",
    "schedule": f"H = {INNER_STEPS} for every DiLoCo variant, fragments of "
                f"{LAYERS_PER_FRAGMENT} layers in the paper's strided pattern, one "
                "fragment's sync every H / fragments steps, an overlap of one inner step "
                "(tau = 1) for the overlapped rows and none for the others.",
    "latency": f"WAN latency {LATENCY} one way and TCP buffers of {TCP_BUFFER} with slow "
               "start after idle off: the paper's simulation is bandwidth alone, so TCP's "
               "windows and round trips are kept out of the way.",
    "bandwidth": "A cell's bandwidth is the paper's: payload bits per second. The simulated "
                 f"link is set to it over TCP's payload share ({PAYLOAD_EFFICIENCY:.4f}, "
                 "1448 of 1500 bytes), so that its payload rate is the cell's.",
    "compute utilization": "Compute time over wall time of one worker over the second whole "
                           "cycle of H steps (data parallelism: one step, after two to "
                           "warm up).",
    "grid": "The paper's cells are points of a grid of 50 bandwidths from 0.1 to 1000 "
            "Gbit/s evenly spaced in log (x1.2068 a step), each the least at which its "
            "simulation reached the utilization; this benchmark searches the same grid, so "
            "that a cell and the paper's differ by whole steps.",
}


def topology(gbit: float) -> Any:
    """Two datacenters of one GPU each, `gbit` Gbit/s of payload between them."""
    def dc(name: str) -> dict[str, Any]:
        return {"name": name, "gpus": 1, "gpu": "worker", "bandwidth": "1000Tbit",
                "latency": "1us"}

    link = gbit * 1e9 / PAYLOAD_EFFICIENCY
    return parse_topology({
        "name": "streaming-table",
        "tcp": {"congestion": "cubic", "rmem": TCP_BUFFER, "wmem": TCP_BUFFER,
                "slow_start_after_idle": False},
        # the step time costs compute: the peak is never used, memory never bounds
        "gpu_types": {"worker": {"peak": "1000TFLOPS", "memory": "64TiB", "efficiency": 0.5}},
        "datacenters": [dc("east"), dc("west")],
        "wan": [{"between": ["east", "west"], "latency": LATENCY,
                 "bandwidth": f"{link:.6g}bit"}],
    }, "streaming-table")


def model(size: str) -> ModelShape:
    params, layers, _, width = SIZES[size]
    per_layer = params / layers
    ffn = round((per_layer - 4 * width * width) / (2 * width))
    return ModelShape(layers=layers, hidden=width, heads=width // 128, seq_len=2048, vocab=256,
                      ffn=ffn)


def job(size: str, iterations: int) -> Job:
    step = SIZES[size][2]
    return Job(model(size), microbatches=1, dp=WORKERS, pp=1, iterations=iterations,
               compute_time=ComputeTime("step", step))


def layer_bucket_mb(shape: ModelShape) -> float:
    """A bucket size that cuts the model's gradient into BUCKETS_PER_LAYER buckets a
    layer. The paper's DAG reduces each layer as its backward ends; a bucket here is an
    even share of the values and waits for the last layer it touches, so with one a layer
    the last two wait for the backward's end (two layers reduced after it, where the
    paper's DAG has one), with eighths 1.125 layers' worth."""
    return shape.params * 2 / (shape.layers * BUCKETS_PER_LAYER) / 2**20 * (1 + 1e-9)


def options(size: str, method: str) -> tuple[str, dict[str, str]]:
    policy, given = METHODS[method]
    shape = model(size)
    chosen = {**given, "bucket_mb": f"{layer_bucket_mb(shape):.9g}"}
    if policy == "streaming-diloco":
        chosen["fragments"] = str(shape.layers // LAYERS_PER_FRAGMENT)
    return policy, chosen


def utilization(size: str, method: str, gbit: float) -> float:
    """The simulated compute utilization of `method` at `gbit` Gbit/s."""
    policy_name, chosen = options(size, method)
    cycle = 1 if policy_name == "dp-across-dc" else INNER_STEPS
    iterations = 4 if cycle == 1 else 2 * cycle + 1
    simulated_job = job(size, iterations)
    links = topology(gbit)
    policy = training_policy(policy_name, chosen)
    plan = plan_with_simulator(policy, links, simulated_job)
    result = Simulator(links, simulated_job, plan, policy).run()
    ends = iteration_ends(result.spans, plan.used_gpus())
    first, last = (2, 3) if cycle == 1 else (cycle - 1, 2 * cycle - 1)
    return cycle * SIZES[size][2] / (ends[last] - ends[first])


def least_on_grid(measure: Callable[[int], float], target: float, low: int) -> int | None:
    """The least grid index from `low` on whose utilization reaches `target` (utilization
    grows with bandwidth), or None when not even the grid's top does."""
    if measure(len(GRID) - 1) < target:
        return None
    lo, hi = low, len(GRID) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if measure(mid) >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def paper_grid_index(value: float) -> int:
    """The grid point a printed cell names (the nearest in log)."""
    return min(range(len(GRID)), key=lambda k: abs(math.log(GRID[k] / value)))


def table_part() -> dict[str, Any]:
    rows: dict[str, dict[str, Any]] = {}
    for size in SIZES:
        rows[size] = {}
        for method in METHODS:
            measured: dict[int, float] = {}

            def measure(k: int, size: str = size, method: str = method,
                        measured: dict[int, float] = measured) -> float:
                if k not in measured:
                    measured[k] = utilization(size, method, GRID[k])
                return measured[k]

            cells = []
            low = 0
            for target, printed in zip(TARGETS, PAPER_TABLE4[size][method], strict=True):
                found = least_on_grid(measure, target, low)
                paper_k = paper_grid_index(printed)
                cells.append({
                    "target": target, "paper_gbit": printed, "paper_grid_index": paper_k,
                    "simulated_grid_index": found,
                    "simulated_gbit": None if found is None else round(GRID[found], 3),
                    "ratio": None if found is None else GRID[found] / GRID[paper_k],
                    "utilization_at_cell": None if found is None else measured[found],
                    "utilization_one_below": measured.get(found - 1) if found else None,
                })
                low = found or 0
            rows[size][method] = {"cells": cells, "simulations": len(measured),
                                  "utilization_by_gbit": {f"{GRID[k]:.4g}": u for k, u
                                                          in sorted(measured.items())}}
            print(f"{size} {method}: " + ", ".join(
                f"{c['target']:.0%} {c['simulated_gbit']} (paper {c['paper_gbit']})"
                for c in cells), flush=True)
    return {"rows": rows, "summary": summary(rows), "payload": payload_check(rows)}


def summary(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    ratios = [(size, method, cell) for size, methods in rows.items()
              for method, row in methods.items() for cell in row["cells"]]
    found = [(s, m, c) for s, m, c in ratios if c["ratio"] is not None]
    geo = math.exp(statistics.fmean(math.log(c["ratio"]) for _, _, c in found)) \
        if found else None
    worst = max(found, key=lambda t: abs(math.log(t[2]["ratio"])), default=None)
    by_method = {method: math.exp(statistics.fmean(
        math.log(c["ratio"]) for s, m, c in found if m == method)) for method in METHODS}
    within = sum(1 for _, _, c in found if 1 / WORST_CELL <= c["ratio"] <= WORST_CELL)
    return {
        "cells": len(ratios), "reached": len(found),
        "geometric_mean_ratio": geo,
        "geometric_mean_by_method": by_method,
        "cells_within_25_percent": within,
        "same_grid_point": sum(1 for _, _, c in found if c["ratio"] == 1.0),
        "worst": None if worst is None else {"size": worst[0], "method": worst[1],
                                             "target": worst[2]["target"],
                                             "ratio": worst[2]["ratio"]},
        "target": {"geometric_mean": list(TARGET_RATIO), "worst_cell": WORST_CELL},
        "met": geo is not None and TARGET_RATIO[0] <= geo <= TARGET_RATIO[1]
        and within == len(ratios),
    }


def table1_part() -> dict[str, Any]:
    out: dict[str, Any] = {}
    for method, printed in PAPER_TABLE1.items():
        at_one = utilization("1B", method, 1.0)
        unlimited = utilization("1B", method, UNLIMITED_GBIT)
        simulated = unlimited / at_one
        step = SIZES["1B"][2]
        paper: list[dict[str, Any]] = [
            {"token_budget": budget, "hours_unlimited": free, "hours_1gbit": slow,
             "ratio": slow / free,
             # what waits at 1 Gbit/s a step, and so its bits, less what the backward hides
             "implies_gbit_per_step": [(slow / free - 1) * step,
                                       (slow / free - 1 + 2 / 3) * step]}
            for budget, free, slow in printed]
        out[method] = {"simulated_ratio": simulated, "utilization_at_1gbit": at_one,
                       "utilization_unlimited": unlimited, "paper": paper,
                       "ratio_to_paper": [simulated / p["ratio"] for p in paper]}
        print(f"Table 1 {method}: {simulated:.3g}x at 1 Gbit/s (paper "
              + ", ".join(f"{p['ratio']:.3g}x" for p in paper) + ")", flush=True)
    return out


OVERLAP_TOPOLOGY = "paper-3dc"
OVERLAP_SETS: dict[str, object] = {"model": "gpt2", "model.vocab": 1024, "microbatches": 1,
                                   "compute_time.step": "16s"}
"""paper-3dc's topology and plan shape (dp 3 x pp 4, a pipeline in each datacenter) with a
job whose reduction the backward can hide: GPT-2's blocks with a 1024-token vocabulary (its
50,257-token embedding, ready only as the backward ends, would be two thirds of the first
stage's gradient), one microbatch a step (DDP reduces in the last microbatch's backward
alone) and a measured step of 16 s. The shipped 13B job's iterations, five minutes of
gradients over 1 Gbit/s links, are past what an emulated run here can take, and what
its buckets save is a fraction of a percent (`shipped_job`, simulated)."""
OVERLAP_ITERATIONS = 4
OVERLAP_VARIANTS: dict[str, dict[str, str]] = {
    "buckets": {"bucket_mb": f"{DDP_BUCKET_MB:g}"},
    "one all-reduce": {"bucket_mb": "0"},
}


def overlap_part(work: Path, backends: tuple[str, ...], dilation: str,
                 before: dict[str, Any] | None) -> dict[str, Any]:
    """dp-across-dc with DDP's buckets started in the backward against one all-reduce
    after it: each backend's iteration time (the median after the first) both ways, the
    time the buckets save and how far the two backends agree on it."""
    from testbed import api

    inputs = api.load(ROOT / "topologies" / f"{OVERLAP_TOPOLOGY}.yaml", sets=OVERLAP_SETS,
                      iterations=OVERLAP_ITERATIONS)
    out: dict[str, Any] = before or {"topology": OVERLAP_TOPOLOGY, "sets": OVERLAP_SETS,
                                     "iterations": OVERLAP_ITERATIONS,
                                     "policy": "dp-across-dc", "runs": {}}
    for label, chosen in OVERLAP_VARIANTS.items():
        run = out["runs"].setdefault(label, {"options": chosen})
        folder = work / label.replace(" ", "-")
        if "simulate" in backends:
            simulated = api.simulate(inputs, "dp-across-dc", chosen,
                                     out=folder / "simulate").results
            run["simulated_iteration_s"] = simulated["iteration_time_s"]["median"]
        if "emulate" in backends:
            if "emulated_iteration_s" in run:  # an earlier emulation is kept, not replaced
                out.setdefault("earlier_emulations", []).append(
                    {"variant": label, "iteration_s": run["emulated_iteration_s"],
                     "iterations_s": run.get("emulated_iterations_s"),
                     "dilation": run.get("dilation")})
            emulated = api.emulate(inputs, "dp-across-dc", chosen, compute="emulated",
                                   dilation="auto" if dilation == "auto" else int(dilation),
                                   out=folder / "emulate", say=lambda _m: None).results
            run.update({"emulated_iteration_s": emulated["iteration_time_s"]["median"],
                        "emulated_iterations_s": emulated["iteration_time_s"]["all"],
                        "predicted_iteration_s": emulated.get("predicted_iteration_s"),
                        "dilation": emulated.get("dilation"),
                        "emulation": emulated.get("emulation")})
        print(f"{label}: " + ", ".join(f"{key} {value:.3f} s" for key, value in run.items()
                                       if key.endswith("iteration_s") and value), flush=True)
    if "simulate" in backends:  # the shipped job, in the simulator alone
        shipped = api.load(ROOT / "topologies" / f"{OVERLAP_TOPOLOGY}.yaml",
                           iterations=OVERLAP_ITERATIONS)
        out["shipped_job"] = {label: api.simulate(
            shipped, "dp-across-dc", chosen, out=work / "shipped" / label.replace(" ", "-"))
            .results["iteration_time_s"]["median"] for label, chosen in OVERLAP_VARIANTS.items()}
    runs = out["runs"]
    for backend in ("simulated", "emulated"):
        key = f"{backend}_iteration_s"
        if all(key in run for run in runs.values()):
            without, with_buckets = runs["one all-reduce"][key], runs["buckets"][key]
            out[f"{backend}_saved_s"] = without - with_buckets
            out[f"{backend}_speedup"] = without / with_buckets
    if "simulated_saved_s" in out and "emulated_saved_s" in out:
        out["saved_emulated_over_simulated"] = out["emulated_saved_s"] / out["simulated_saved_s"]
    return out


def implied_sync_gbit(size: str, cells: list[float]) -> tuple[float, float] | None:
    """The bits a full sync moves (Gbit) that a Vanilla DiLoCo row's cells allow: a cycle
    is H steps of compute and the sync's P / B seconds, less what of it the last backward
    hides (between nothing and the whole backward, 2/3 of a step), so reaching
    utilization c at grid point g_k and not at g_(k-1) puts P in
    (g_(k-1) W, g_k (W + 2s/3)] with W = H s (1/c - 1); the row allows the intersection
    (None when empty)."""
    step = SIZES[size][2]
    low, high = 0.0, math.inf
    for target, gbit in zip(TARGETS, cells, strict=True):
        k = paper_grid_index(gbit)
        waits = INNER_STEPS * step * (1 / target - 1)
        high = min(high, GRID[k] * (waits + 2 * step / 3))
        if k:
            low = max(low, GRID[k - 1] * waits)
    return (low, high) if low < high else None


def payload_check(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What a full sync moves by the paper's Vanilla DiLoCo cells and by the simulator's,
    against its parameters' 16 bits each."""
    out = {}
    for size in SIZES:
        simulated = [c["simulated_gbit"] for c in rows[size]["Vanilla DiLoCo"]["cells"]]
        paper = implied_sync_gbit(size, list(PAPER_TABLE4[size]["Vanilla DiLoCo"]))
        ours = None if None in simulated else implied_sync_gbit(size, simulated)
        out[size] = {"bf16_gbit": model(size).params * 16 / 1e9, "paper_implies_gbit": paper,
                     "simulator_implies_gbit": ours}
    return out


def _cell(cell: dict[str, Any]) -> str:
    if cell["simulated_gbit"] is None:
        return f"{cell['paper_gbit']:g} / over 1000"
    return (f"{cell['paper_gbit']:g} / {cell['simulated_gbit']:.3g} "
            f"({cell['ratio']:.2f}x)")


def table(report: dict[str, Any]) -> str:
    """Table 4 paper against simulator per cell, Table 1's ratios, the payload the paper's
    cells imply, from the benchmark's JSON alone."""
    lines: list[str] = []
    table4 = report.get("table4")
    if table4:
        targets = report["targets"]
        lines += ["| size | method | " + " | ".join(f"CU {t:.0%}: paper / simulated Gbit/s"
                                                     for t in targets) + " |",
                  "| --- | --- | " + " | ".join("---" for _ in targets) + " |"]
        for size, methods in table4["rows"].items():
            step = SIZES[size][2] if size in SIZES else None
            for method, row in methods.items():
                label = f"{size} ({step:g} s a step)" if step else size
                lines.append(f"| {label} | {method} | "
                             + " | ".join(_cell(c) for c in row["cells"]) + " |")
        s = table4["summary"]
        worst = s["worst"]
        lines += ["", f"Geometric mean of simulated over paper: **{s['geometric_mean_ratio']:.3f}**"
                  f" over {s['reached']} of {s['cells']} cells (target "
                  f"{s['target']['geometric_mean'][0]:.2f}-{s['target']['geometric_mean'][1]:.2f}"
                  f"); {s['cells_within_25_percent']} cells within 25%, {s['same_grid_point']} "
                  f"on the paper's grid point; worst {worst['size']} {worst['method']} at "
                  f"{worst['target']:.0%}: {worst['ratio']:.2f}x. By method: "
                  + ", ".join(f"{m} {r:.2f}x" for m, r in s["geometric_mean_by_method"].items())
                  + ". Target met: " + ("yes" if s["met"] else "no") + "."]
        steps: dict[int, int] = {}
        for methods in table4["rows"].values():
            for row in methods.values():
                for c in row["cells"]:
                    if c["simulated_grid_index"] is not None:
                        gap = c["simulated_grid_index"] - c["paper_grid_index"]
                        steps[gap] = steps.get(gap, 0) + 1
        lines += ["", "Grid steps (x1.207 each) from the paper's cell to the simulator's: "
                  + ", ".join(f"{gap:+d}: {count} cells" for gap, count in sorted(steps.items()))
                  + "."]
        check = table4.get("payload")
        if check:
            lines += ["", "| size | a full sync at 16 bits a parameter | what the paper's "
                      "Vanilla DiLoCo cells allow | what the simulator's allow |",
                      "| --- | --- | --- | --- |"]
            for size, c in check.items():
                def span(pair: list[float] | None, full: float = c["bf16_gbit"]) -> str:
                    if pair is None:
                        return "none"
                    return (f"{pair[0]:,.1f}-{pair[1]:,.1f} Gbit ({pair[0] / full:.2f}-"
                            f"{pair[1] / full:.2f} of it)")
                lines.append(f"| {size} | {c['bf16_gbit']:,.1f} Gbit | "
                             f"{span(c['paper_implies_gbit'])} | "
                             f"{span(c['simulator_implies_gbit'])} |")
    table1 = report.get("table1")
    if table1:
        lines += ["", "| Table 1 (1B): hours at 1 Gbit/s over hours unlimited | paper (25B, "
                  "100B, 250B tokens) | simulated |", "| --- | --- | --- |"]
        for method, row in table1.items():
            paper = ", ".join(f"{p['ratio']:.3g}x" for p in row["paper"])
            lines.append(f"| {method} | {paper} | {row['simulated_ratio']:.3g}x |")
        parallel = table1.get("Data-Parallel", {}).get("paper", [])
        if parallel and "implies_gbit_per_step" in parallel[0]:
            spans = ", ".join(f"{p['implies_gbit_per_step'][0]:.2f}-"
                              f"{p['implies_gbit_per_step'][1]:.2f}" for p in parallel)
            lines += ["", "At 1 Gbit/s data parallelism's step waits for its gradients' bits "
                      "less what the backward hides, so Table 1's Data-Parallel ratios put a "
                      f"step's all-reduce at {spans} Gbit: 16 bits a parameter, where Table "
                      "4's cells allow less (above)."]
    return "\n".join(lines).strip()


def overlap_table(report: dict[str, Any]) -> str:
    """Data parallelism's buckets on paper-3dc in both backends, from the JSON alone."""
    overlap = report.get("overlap")
    if not overlap:
        return ""
    runs = overlap["runs"]
    lines = ["| dp-across-dc | simulated iteration | emulated iteration | emulated dilation |",
             "| --- | --- | --- | --- |"]
    for label, run in runs.items():
        emulated = run.get("emulated_iteration_s")
        lines.append(f"| {label} (`-o bucket_mb={run['options']['bucket_mb']}`) | "
                     f"{run['simulated_iteration_s']:.3f} s | "
                     + ("-" if emulated is None else f"{emulated:.3f} s") + " | "
                     + str(run.get("dilation") or "-") + " |")
    simulated, emulated = overlap.get("simulated_saved_s"), overlap.get("emulated_saved_s")
    if simulated is not None:
        lines += ["", f"Buckets save {simulated:.3f} s an iteration in the simulator"
                  + (f", {emulated:.3f} s in the emulator: the emulator's saving is "
                     f"{overlap['saved_emulated_over_simulated']:.2f}x the simulator's"
                     if emulated is not None else "") + "."]
        spreads = [f"{label} {min(run['emulated_iterations_s']):.3f}-"
                   f"{max(run['emulated_iterations_s']):.3f} s"
                   for label, run in runs.items() if run.get("emulated_iterations_s")]
        if spreads:
            lines[-1] += " Emulated iterations: " + ", ".join(spreads) + "."
    earlier = overlap.get("earlier_emulations")
    if earlier:
        lines += ["", "Earlier emulations of the same runs: " + ", ".join(
            f"{e['variant']} {e['iteration_s']:.3f} s (dilation {e['dilation']})"
            for e in earlier) + "."]
    shipped = overlap.get("shipped_job")
    if shipped:
        buckets, one = shipped["buckets"], shipped["one all-reduce"]
        lines += ["", f"paper-3dc's shipped job (13B), simulated: {buckets:.2f} s with buckets, "
                  f"{one:.2f} s with one all-reduce ({one - buckets:.2f} s saved)."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="table,table1")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--from-json", type=Path,
                        help="start from this report (parts not run keep its figures)")
    parser.add_argument("--dilation", default="auto", help="overlap: the emulator's dilation")
    args = parser.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    report: dict[str, Any] = json.loads(args.from_json.read_text()) if args.from_json else {}
    report.update({"source": SOURCE, "assumptions": ASSUMPTIONS, "targets": list(TARGETS),
                   "grid_gbit": [round(g, 4) for g in GRID]})

    def save() -> None:
        if args.json:
            args.json.write_text(json.dumps(report, indent=1) + "\n")

    if "table" in parts:
        report["table4"] = table_part()
        save()
    if "table1" in parts:
        report["table1"] = table1_part()
        save()
    backends = tuple(p.removeprefix("overlap-") for p in parts if p.startswith("overlap"))
    if backends:
        with tempfile.TemporaryDirectory() as tmp:
            report["overlap"] = overlap_part(Path(tmp), backends, args.dilation,
                                             report.get("overlap"))
    save()


if __name__ == "__main__":
    main()
