#!/usr/bin/env python3
"""Do the emulator and the simulator tell the same truth? Every registered training policy
on each topology, simulated and emulated (at dilation 1 and at the dilation `auto` picks),
with the error of each emulated median against the simulated one.

Run as root: `.venv/bin/python scripts/bench_fidelity.py [--topologies
two-dc,paper-3dc,high-bdp-2dc,asymmetric-4dc,FILE.yaml] [--policies gpipe,atlas]
[--repeat 1] [--max-wall 900] [--json benchmarks/fidelity.json]`.
Emulated compute, the topology's own job and iterations (the first excluded). A run whose
predicted wall time exceeds `--max-wall` seconds is not run and says so. Prints a markdown
table; the JSON has every run's figures and its emulation health.

`--parts long-link`: a pipeline across one 10 Gbit/s, 100 ms link (beyond what this
machine forwards undilated), emulated at the dilation `auto` picks against the simulator;
`--parts dilation`: two-dc at K=1 and K=4 (`--repeat` runs each), which must agree;
`--parts trace`: two-dc's link following a measured-style bandwidth trace
(scenarios/two-dc-wan-trace.yaml), compared by tokens/s over the run;
`--parts resimulate` (no root, no emulator): the table's simulated figures made again by
the current model, against the same emulated runs (their commits kept, the simulator's
recorded beside them);
`--parts share-noise` (no root, no emulator): every judged row of the table's JSON
simulated with equal shares (`--jitter share=0`) and with shares drawn at its congestion
control's sawtooth (the default, testbed.plan.tcp_model.sawtooth_cv) at the job's seed
and over `--seeds` seeds, against the same emulated runs.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from measured_at import commit

from testbed.common.spans import Span
from testbed.common.units import plural
from testbed.emulator.runtime.coordinator.capacity import machine_capacity_bps, worker_costs
from testbed.errors import InputError
from testbed.experiments.inputs import Inputs, load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.experiments.run import run
from testbed.metrics.lockstep import lockstep
from testbed.plan.jitter import Jitter
from testbed.plan.queue_mismatch import queue_mismatches
from testbed.plan.tcp_model import sawtooth_cv
from testbed.policy.registry import discover, training_policy
from testbed.run.dilation import (
    busiest_spans_per_second,
    choose_dilation,
    dilate_topology,
    peak_rate_bps,
)
from testbed.run.spec import RunSpec
from testbed.scenario.scenario import Scenario
from testbed.sim.simulate import simulate_plan

ROOT = Path(__file__).resolve().parent.parent


def emulate(topology: Any, job: Any, policy: str, dilation: int, repeat: int,
            scratch: Path, inputs: Inputs | None = None) -> dict[str, Any]:
    """`inputs`: events and a scenario to run under (with their topology and job)."""
    medians, rates, runs = [], [], []
    for k in range(repeat):
        spec = RunSpec.build("emulate", topology, job, policy=policy, compute="emulated",
                             dilation=dilation, events=inputs.events if inputs else (),
                             scenario=inputs.scenario if inputs else Scenario())
        started = time.monotonic()
        outcome = run(spec, scratch / f"{topology.name}-{policy}-{dilation}-{k}", print)
        results = outcome.results
        runs.append({"median_s": results["iteration_time_s"]["median"],
                     "tokens_per_s": results["tokens_per_s"],
                     "status": results["status"], "dilation": results["dilation"],
                     "emulation": results.get("emulation"),
                     "wall_s": time.monotonic() - started})
        if results["iteration_time_s"]["median"] is not None:
            medians.append(results["iteration_time_s"]["median"])
            rates.append(results["tokens_per_s"])
    return {"median_s": statistics.median(medians) if medians else None,
            "tokens_per_s": statistics.median(rates) if rates else None,
            "runs": runs, "dilation": runs[-1]["dilation"]}


LONG_LINK = {
    "name": "long-link",
    "tcp": {"congestion": "cubic", "rmem": ["4KiB", "128KiB", "64MiB"],
            "wmem": ["4KiB", "16KiB", "64MiB"]},
    "datacenters": [{"name": "east", "gpus": 2, "gpu": "a100", "bandwidth": "100Gbit"},
                    {"name": "west", "gpus": 2, "gpu": "a100", "bandwidth": "100Gbit"}],
    "wan": [{"between": ["east", "west"], "latency": "100ms", "bandwidth": "10Gbit"}],
    "job": {"model": "gpt2-xl", "microbatch_size": 4, "microbatches": 8, "dp": 2, "pp": 2,
            "iterations": 3, "seed": 0},
}


def long_link(repeat: int, scratch: Path, capacity: float) -> dict[str, Any]:
    from testbed.job.load import load_job
    from testbed.topology import parse_topology

    topology = parse_topology(LONG_LINK, "long-link")
    job = load_job(topology.job, "long-link", None, [])
    out: dict[str, Any] = {"topology": LONG_LINK}
    for policy in ("gpipe", "1f1b"):
        chosen = training_policy(policy)
        plan = plan_with_simulator(chosen, topology, job)
        summary, spans = simulate_plan(topology, job, plan, chosen)
        k = choose_dilation(peak_rate_bps(spans), capacity)
        out[policy] = {"simulated_s": summary.median_s, "dilation": k,
                       "emulated": emulate(topology, job, policy, k, repeat, scratch)}
        print(json.dumps({policy: out[policy]}), flush=True)
    return out


def dilation_pair(repeat: int, scratch: Path) -> dict[str, Any]:
    inputs = load_inputs(ROOT / "topologies" / "two-dc.yaml", sets=("iterations=20",))
    out: dict[str, Any] = {}
    for policy in ("gpipe", "1f1b"):
        out[policy] = {str(k): emulate(inputs.topology, inputs.job, policy, k, repeat, scratch)
                       for k in (1, 4)}
        print(json.dumps({policy: out[policy]}), flush=True)
    return out


TRACE_SETS = ("model=gpt2", "microbatches=8", "iterations=20")
"""GPT-2's 6.3 MB activations: at the trace's rates the link, not this machine, sets the
pace; 20 iterations cover the trace's first 30-60 seconds."""


def trace_case(repeat: int, scratch: Path, dilations: list[int]) -> dict[str, Any]:
    """Emulated (at each dilation) and simulated runs under the measured-style trace, and
    calm, by tokens/s over the run (the median iteration would hide the trace's slow
    seconds)."""
    scenario = ROOT / "scenarios" / "two-dc-wan-trace.yaml"
    inputs = load_inputs(ROOT / "topologies" / "two-dc.yaml", scenario=scenario,
                         sets=TRACE_SETS)
    calm = load_inputs(ROOT / "topologies" / "two-dc.yaml", sets=TRACE_SETS)
    out: dict[str, Any] = {"scenario": str(scenario.relative_to(ROOT)), "job": TRACE_SETS,
                           "rows": []}
    for policy in ("gpipe", "1f1b"):
        simulated = {name: run(RunSpec.build("simulate", given.topology, given.job, policy=policy,
                                             events=given.events, scenario=given.scenario),
                               scratch / f"trace-{policy}-{name}").results
                     for name, given in (("trace", inputs), ("calm", calm))}
        sim_rate = simulated["trace"]["tokens_per_s"]
        calm_rate = simulated["calm"]["tokens_per_s"]
        for k in dilations:
            emulated = emulate(inputs.topology, inputs.job, policy, k, repeat, scratch, inputs)
            calm_emulated = emulate(calm.topology, calm.job, policy, k, repeat,
                                    scratch / "calm")
            row = {"policy": policy, "dilation": k, "simulated_tokens_per_s": sim_rate,
                   "simulated_median_s": simulated["trace"]["iteration_time_s"]["median"],
                   "calm_simulated_tokens_per_s": calm_rate,
                   "emulated": emulated, "calm_emulated": calm_emulated,
                   "error": _ratio(emulated["tokens_per_s"], sim_rate),
                   "calm_error": _ratio(calm_emulated["tokens_per_s"], calm_rate)}
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    return out


def resimulate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each row's simulated iteration (and a dilated run's, dilated_s) by the current
    model, and where its plan crosses queues too shallow for its round trips
    (testbed.plan.queue_mismatch), its emulated runs as they were: the plan each policy
    makes now must be the one that was emulated, or the row says it is not."""
    done = {"simulated_commit": commit()}
    out = []
    for row in rows:
        if row["simulated_s"] is None:  # no plan
            out.append(row)
            continue
        inputs = load_inputs(topology_file(row["topology"]))
        chosen = training_policy(row["policy"])
        plan = plan_with_simulator(chosen, inputs.topology, inputs.job)
        if f"dp {plan.dp} x pp {plan.pp}" != row["plan"]:
            raise SystemExit(f"{row['topology']} {row['policy']}: plans dp {plan.dp} x pp "
                             f"{plan.pp} now, {row['plan']} when emulated: run the table "
                             "again (--keep)")
        row = {**row, **done, "simulated_s": dilated_s(inputs.topology, inputs.job, plan,
                                                        chosen, 1),
               "queue_mismatches": queue_mismatches(inputs.topology, plan)}
        for name in ("k1", "auto"):
            block = row.get(name)
            if block is not None and block.get("simulated_dilated_s") is not None:
                row[name] = {**block, "simulated_dilated_s": dilated_s(
                    inputs.topology, inputs.job, plan, chosen, block["dilation"])}
        out.append(row)
        print(json.dumps({k: row[k] for k in ("topology", "policy", "simulated_s")}),
              flush=True)
    return out


def share_noise(rows: list[dict[str, Any]], seeds: int) -> dict[str, Any]:
    """Each judged row (summary's choice of run) simulated with equal shares and with
    shares drawn at its congestion control's sawtooth, seed by seed: equal flows that
    meet at a bottleneck never get exactly equal shares in real TCP, and where a plan's
    replicas send in step, exactly equal shares keep them in step."""
    out: dict[str, Any] = {"seeds": seeds, "commit": commit(), "rows": []}
    for row in rows:
        block = _judged(row)
        if block is None:
            continue
        inputs = load_inputs(topology_file(row["topology"]))
        congestion = inputs.topology.tcp.congestion
        k = block["runs"][0]["dilation"]
        chosen = training_policy(row["policy"])
        plan = plan_with_simulator(chosen, inputs.topology, inputs.job)

        simulated = functools.partial(dilated_s, inputs.topology, inputs.job, plan, chosen, k)
        equal_s, equal_spans = dilated_run(inputs.topology, inputs.job, plan, chosen, k,
                                           Jitter(share=0.0))
        noisy = [s for seed in range(seeds)
                 if (s := simulated(Jitter(seed=seed))) is not None]
        entry = {"topology": row["topology"], "policy": row["policy"], "plan": row["plan"],
                 "congestion": congestion, "share_cv": sawtooth_cv(congestion),
                 "dilation": k, "seed": inputs.job.seed,
                 "emulated_s": block["median_s"], "emulated_runs": len(block["runs"]),
                 "equal_s": equal_s, "in_step": lockstep(equal_spans),
                 "sawtooth_s": simulated(Jitter(seed=inputs.job.seed)),
                 "noisy_s": noisy, "noisy_median_s": statistics.median(noisy) if noisy else None,
                 "load": os.getloadavg()[0]}
        out["rows"].append(entry)
        print(json.dumps(entry), flush=True)
    return out


COST_SIZES = ((4096, 8), (16384, 8))
"""GPT-3 175B with 1F1B (scripts/bench_sim.py's scale table) at these GPUs x
microbatches: what drawn shares cost the simulator where many replicas contend."""


def share_noise_cost(sizes: tuple[tuple[int, int], ...] = COST_SIZES) -> list[dict[str, Any]]:
    """The simulator's CPU seconds for one iteration with equal shares and with
    `share=sawtooth`: equal flows started together end together and are solved once;
    drawn shares end them apart, each end solving its link's flows anew."""
    from bench_sim import gpt3

    from testbed.sim.simulator import Simulator

    rows = []
    for gpus, microbatches in sizes:
        topology, job = gpt3(gpus, microbatches)
        policy = training_policy("1f1b")
        plan = plan_with_simulator(policy, topology, job)
        row: dict[str, Any] = {"gpus": gpus, "microbatches": microbatches,
                               "load": os.getloadavg()[0]}
        for name, jitter in (("equal", Jitter(share=0.0)), ("sawtooth", Jitter(seed=job.seed))):
            cpu = time.process_time()
            result = Simulator(topology, job, plan, policy, jitter=jitter).run()
            row[f"{name}_cpu_s"] = time.process_time() - cpu
            row[f"{name}_end_s"] = max(s["end"] for s in result.spans)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def share_noise_part(source: Path, seeds: int, path: Path | None) -> None:
    result = share_noise(json.loads(source.read_text())["rows"], seeds)
    result["cost"] = share_noise_cost()
    path = path or ROOT / "benchmarks" / "fidelity-share-noise.json"
    path.write_text(json.dumps(result, indent=1))
    print(share_noise_table(result))
    print(share_noise_summary(result))
    print(share_noise_cost_table(result["cost"]))


def share_noise_cost_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| GPUs | microbatches | equal shares: CPU | iteration | drawn (default): CPU | "
             "iteration | CPU, x equal shares |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['gpus']:,} | {row['microbatches']} | {row['equal_cpu_s']:.2f} s | "
                     f"{row['equal_end_s']:.3f} s | {row['sawtooth_cpu_s']:.2f} s | "
                     f"{row['sawtooth_end_s']:.3f} s | "
                     f"{row['sawtooth_cpu_s'] / row['equal_cpu_s']:.1f}x |")
    return "\n".join(lines)


def _judged(row: dict[str, Any]) -> dict[str, Any] | None:
    """The emulated runs a row is judged by (summary): at the least dilation the machine
    did not limit; None where it is not judged."""
    if "skipped" in row or not row["simulated_s"] or _one_gpu(row):
        return None
    free = [b for b in _measured(row) if not _bound(b)]
    return free[0] if free else None


def _measured(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A row's emulated runs that gave a figure: at K=1, then at K auto."""
    return [b for b in (row.get("k1"), row.get("auto"))
            if b is not None and b["median_s"] is not None]


def emulate_auto(k1: dict[str, Any], k_auto: int, wall: float, max_wall: float,
                 emulated: Callable[..., dict[str, Any]],
                 simulated: Callable[[int], float | None]) -> dict[str, Any] | None:
    """The runs at the dilation `auto` picked (K=1's own where it picked 1) and, where
    those were machine-bound, once more at the dilation they suggested (`followed`);
    None where the wall time would pass `max_wall`."""
    block, followed = (k1 if k_auto == 1 else None), False
    while True:
        if k_auto > 1 and wall * k_auto <= max_wall:
            block = emulated(dilation=k_auto)
            block["simulated_dilated_s"] = simulated(k_auto)
            block["followed"] = followed
        suggested = _suggested(block)
        if followed or suggested is None or suggested <= k_auto:
            return block
        k_auto, followed = suggested, True


def _suggested(block: dict[str, Any] | None) -> int | None:
    """The dilation a machine-bound block's runs suggest (the most of them), as a user
    told `try --dilation N` would go on; None where the machine did not limit them."""
    wanted = [r["emulation"]["suggested_dilation"] for r in (block or {}).get("runs", ())
              if (r.get("emulation") or {}).get("cpu_bound")]
    return max(wanted) if wanted else None


def _reference(row: dict[str, Any], block: dict[str, Any]) -> float:
    """What a run is judged against: the simulator of the network it emulates (a dilated
    run's, dilated_s), else the row's simulated iteration."""
    return float(block.get("simulated_dilated_s") or row["simulated_s"])


def _in_step(row: dict[str, Any]) -> str:
    counts = row.get("in_step")
    return f"{counts['in_step']} of {counts['contended']}" if counts else "-"


def share_noise_table(result: dict[str, Any]) -> str:
    lines = ["| topology | policy | plan | congestion (share CV) | K | emulated | equal shares "
             "(share=0) | error | in step | drawn (the default, the job's seed) | error | seeds' "
             "median (range) | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        noisy = row["noisy_s"]
        runs = f", {row['emulated_runs']} runs" if row["emulated_runs"] > 1 else ""
        emulated = row["emulated_s"]
        lines.append(f"| {row['topology']} | {row['policy']} | {row['plan']} | "
                     f"{row['congestion']} ({row['share_cv']:.1%}) | {row['dilation']} | "
                     f"{emulated:.3f} s{runs} | {row['equal_s']:.3f} s | "
                     f"{_error(emulated, row['equal_s'])} | {_in_step(row)} | "
                     f"{row['sawtooth_s']:.3f} s | "
                     f"{_error(emulated, row['sawtooth_s'])} | "
                     f"{row['noisy_median_s']:.3f} s ({min(noisy):.3f}-{max(noisy):.3f}) | "
                     f"{_error(emulated, row['noisy_median_s'])} |")
    return "\n".join(lines)


def share_noise_summary(result: dict[str, Any]) -> str:
    rows = result["rows"]

    def within(key: str) -> int:
        return sum(1 for r in rows if r[key] is not None
                   and abs(r["emulated_s"] / r[key] - 1) <= TARGET)
    moved = [f"{r['topology']} {r['policy']} ({r['emulated_s'] / r['equal_s'] - 1:+.1%} "
             f"-> {r['emulated_s'] / r['sawtooth_s'] - 1:+.1%})" for r in rows
             if abs(r["sawtooth_s"] / r["equal_s"] - 1) > 0.01]
    stepped = [abs(r["sawtooth_s"] / r["equal_s"] - 1) > 0.01 for r in rows
               if (r.get("in_step") or {}).get("in_step")]
    return (f"Within {TARGET:.0%} of the emulator: {within('equal_s')} of {len(rows)} with "
            f"equal shares, {within('sawtooth_s')} with drawn shares (the default) at the job's "
            "seed, "
            f"{within('noisy_median_s')} at the median of {result['seeds']} seeds. Rows the "
            "share noise moved by more than 1%: " + (", ".join(moved) if moved else "none")
            + ". In step: of the WAN transfers that shared a link with equal shares, those "
            "that started and ended exactly with another (results.json's `lockstep`)"
            + (f"; {plural(len(stepped), 'row')} held some in step, and the share noise moved "
               f"{sum(stepped)} of them by more than 1%" if stepped else "")
            + ". The emulated runs are the table above's (benchmarks/fidelity.json), each "
            "judged as there.")


def _ratio(emulated: float | None, simulated: float | None) -> float | None:
    return emulated / simulated - 1 if emulated and simulated else None


def trace_table(result: dict[str, Any]) -> str:
    """tokens/s: calm and under the trace, simulated and emulated, and the errors."""
    lines = ["| policy | K | calm, simulated | calm, emulated | error | trace, simulated | "
             "trace, emulated | error |", "|---|---|---|---|---|---|---|---|"]
    for row in result["rows"]:
        cells = []
        for name, sim, error in (("calm_emulated", "calm_simulated_tokens_per_s",
                                  "calm_error"),
                                 ("emulated", "simulated_tokens_per_s", "error")):
            block = row[name]
            bound = any((r.get("emulation") or {}).get("cpu_bound") for r in block["runs"])
            cells.append(f"{row[sim]:,.0f} | {block['tokens_per_s']:,.0f}"
                         f"{' (machine-bound)' if bound else ''} | {row[error]:+.1%}")
        lines.append(f"| {row['policy']} | {row.get('dilation', 1)} | " + " | ".join(cells)
                     + " |")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--topologies", default="two-dc,paper-3dc")
    parser.add_argument("--policies", help="comma-separated; default: every registered one")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--max-wall", type=float, default=900.0,
                        help="skip an emulated run predicted to take longer (s)")
    parser.add_argument("--json", type=Path, help="default: benchmarks/fidelity[-PART].json")
    parser.add_argument("--parts", default="table",
                        help="table, long-link, dilation, trace, resimulate, share-noise")
    parser.add_argument("--seeds", type=int, default=5, help="share-noise: seeds per row")
    parser.add_argument("--from", dest="source", type=Path,
                        default=ROOT / "benchmarks" / "fidelity.json",
                        help="resimulate, share-noise: the table's JSON whose emulated runs "
                             "they compare")
    parser.add_argument("--dilations", default="1,2", help="trace: the emulator's K values")
    parser.add_argument("--keep", action="store_true",
                        help="table: keep the JSON's rows of other topologies and policies "
                             "(to measure a table a part at a time)")
    return parser


def main() -> None:
    args = _parser().parse_args()
    if args.parts == "resimulate":
        path = args.json or args.source
        report = json.loads(args.source.read_text())
        report["rows"] = resimulate(report["rows"])
        path.write_text(json.dumps(report, indent=1))
        print(table(report["rows"]))
        print(summary(report["rows"]))
        return
    if args.parts == "share-noise":
        share_noise_part(args.source, args.seeds, args.json)
        return
    if args.parts != "table":
        capacity = machine_capacity_bps(print)
        with tempfile.TemporaryDirectory() as tmp:
            result = {"long-link": lambda: long_link(args.repeat, Path(tmp), capacity),
                      "dilation": lambda: dilation_pair(args.repeat, Path(tmp)),
                      "trace": lambda: trace_case(args.repeat, Path(tmp), [
                          int(k) for k in args.dilations.split(",")])}[args.parts]()
        path = args.json or ROOT / "benchmarks" / f"fidelity-{args.parts}.json"
        path.write_text(json.dumps(result, indent=1))
        if args.parts == "trace":
            print(trace_table(result))
        return
    args.json = args.json or ROOT / "benchmarks" / "fidelity.json"
    policies = (args.policies.split(",") if args.policies
                else [name for name, info in discover("testbed.policies").items() if info.ok])
    capacity = machine_capacity_bps(print)
    span_cpu_s = worker_costs(print).span_cpu_s
    rows: list[dict[str, Any]] = []
    kept = json.loads(args.json.read_text())["rows"] if args.keep and args.json.exists() else []
    measured = {"commit": commit()}  # rows of several runs share one table
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.topologies.split(","):
            inputs = load_inputs(topology_file(name))
            name = inputs.topology.name
            for policy in policies:
                chosen = training_policy(policy)
                try:
                    plan = plan_with_simulator(chosen, inputs.topology, inputs.job)
                except InputError as error:  # e.g. its placement does not fit memory
                    why = str(error).replace(f"{ROOT}/", "")
                    rows.append({"topology": name, "policy": policy, "plan": "-",
                                 "simulated_s": None, "skipped": f"no plan: {why}",
                                 **measured, "load": os.getloadavg()[0]})
                    print(json.dumps(rows[-1]), flush=True)
                    continue
                simulated, spans = simulate_plan(inputs.topology, inputs.job, plan, chosen)
                k_auto = choose_dilation(peak_rate_bps(spans), capacity, path=span_cpu_s
                                         * busiest_spans_per_second(spans))
                row: dict[str, Any] = {"topology": name, "policy": policy,
                                       "plan": f"dp {plan.dp} x pp {plan.pp}",
                                       "simulated_s": simulated.median_s,
                                       "queue_mismatches": queue_mismatches(inputs.topology, plan),
                                       **measured, "load": os.getloadavg()[0]}
                wall = (simulated.median_s or 0.0) * (inputs.job.iterations + 1)
                if wall > args.max_wall:
                    row["skipped"] = f"predicted {wall:.0f} s of wall time per run"
                    rows.append(row)
                    print(json.dumps(row), flush=True)
                    continue
                row["k1"] = emulate(inputs.topology, inputs.job, policy, 1, args.repeat,
                                    Path(tmp))
                row["auto"] = emulate_auto(row["k1"], k_auto, wall, args.max_wall,
                                           functools.partial(
                                               emulate, inputs.topology, inputs.job, policy,
                                               repeat=args.repeat, scratch=Path(tmp)),
                                           functools.partial(dilated_s, inputs.topology,
                                                             inputs.job, plan, chosen))
                rows.append(row)
                print(json.dumps(row), flush=True)
    ran = {(row["topology"], row["policy"]) for row in rows}
    rows = [row for row in kept if (row["topology"], row["policy"]) not in ran] + rows
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"capacity_bps": capacity, "rows": rows}, indent=1))
    print(table(rows))


def dilated_s(topology: Any, job: Any, plan: Any, policy: Any, k: int,
              jitter: Jitter | None = None) -> float | None:
    """The simulator's iteration of the network a run dilated by K emulates (its links K
    times slower, its compute too), in represented seconds: what that run is measured
    against. Where it differs from the undilated network's, dilation itself changed what
    is measured (a window-limited connection keeps less of its buffers in flight on a
    slower link: testbed.plan.tcp_model.window_efficiency). K=1: the network itself."""
    return dilated_run(topology, job, plan, policy, k, jitter)[0]


def dilated_run(topology: Any, job: Any, plan: Any, policy: Any, k: int,
                jitter: Jitter | None = None) -> tuple[float | None, Sequence[Span]]:
    """`dilated_s`, and the run's spans (on the dilated network's clock)."""
    summary, spans = simulate_plan(dilate_topology(topology, k), job, plan, policy,
                                   jitter=jitter)
    return None if summary.median_s is None else summary.median_s / k, spans


GENERATED = ROOT / "scripts" / "fidelity_topologies"
"""Topologies made for this check beside the shipped ones (high-bdp-2dc, asymmetric-4dc,
mid-rate-3dc): shapes the shipped set lacks."""


def topology_file(name: str) -> Path:
    """A shipped topology by name, one of GENERATED's, or any topology file by its path."""
    if name.endswith((".yaml", ".yml")):
        return Path(name)
    shipped = ROOT / "topologies" / f"{name}.yaml"
    return shipped if shipped.exists() else GENERATED / f"{name}.yaml"


def _error(emulated: float | None, simulated: float | None) -> str:
    if emulated is None or not simulated:
        return "-"
    return f"{emulated / simulated - 1:+.1%}"


def _cell(block: dict[str, Any] | None, simulated: float | None, alone: bool) -> str:
    """`alone`: a one-GPU plan, whose error says nothing of the network. A dilated run
    also gives its error against the simulator of the dilated network (dilated_s)."""
    if block is None or block["median_s"] is None:
        return "not run | - |"
    error = "(one GPU)" if alone else _error(block["median_s"], simulated)
    dilated = block.get("simulated_dilated_s")
    if dilated and not alone:
        error += f" ({_error(block['median_s'], dilated)} against the dilated network)"
    return f"{block['median_s']:.3f} s{' (machine-bound)' if _bound(block) else ''} | {error} |"


TARGET = 0.05
"""The agreement the emulator and the simulator are held to where the machine is not the
limit: the emulated median within 5% of the simulated one."""


def _one_gpu(row: dict[str, Any]) -> bool:
    """A one-GPU plan: its emulated time is the emulator's Python, no network's."""
    return bool(row["plan"] == "dp 1 x pp 1")


def _bound(block: dict[str, Any] | None) -> bool:
    return block is not None and any((r.get("emulation") or {}).get("cpu_bound")
                                     for r in block["runs"])


def summary(rows: list[dict[str, Any]]) -> str:
    """How many rows agree within TARGET and which do not (marked where the plan crosses
    queues too shallow for its round trips, which the simulator does not model), each
    judged at the least dilation whose run the machine did not limit (K=1 where it did
    not: a dilation only stands in for what the machine cannot do at K=1); a row limited
    at both is not judged."""
    judged, outside, bound, alone, dilation = 0, [], [], [], []
    for row in rows:
        if "skipped" in row or not row["simulated_s"]:
            continue
        runs = _measured(row)
        if not runs:
            continue
        name = f"{row['topology']} {row['policy']}"
        if _one_gpu(row):
            alone.append(name)
            continue
        block = _judged(row)
        if block is None:  # every run machine-bound
            bound.append(name)
            continue
        judged += 1
        # a dilated run against the network it emulates; dilation's own effect apart
        dilated = block.get("simulated_dilated_s")
        error = block["median_s"] / _reference(row, block) - 1
        k = block["runs"][0]["dilation"]
        if abs(error) > TARGET:
            queues = ", across queues too shallow for its round trips" \
                if row.get("queue_mismatches") else ""
            outside.append(f"{name} ({error:+.1%} at K={k}{queues})")
        if dilated and abs(dilated / row["simulated_s"] - 1) > TARGET:
            dilation.append(f"{name} ({dilated / row['simulated_s'] - 1:+.1%} at K={k})")
    commits = sorted({row.get("commit") or "unknown" for row in rows})
    simulated = sorted({row["simulated_commit"] for row in rows if "simulated_commit" in row})
    repeated = [f"{row['topology']} {row['policy']} at K={block['dilation']}: "
                f"{len(block['runs'])} runs" for row in rows
                for block in _blocks(row) if len(block["runs"]) > 1]
    return (f"Each at the least dilation the machine did not limit, {judged - len(outside)} "
            f"of {judged} agree within {TARGET:.0%}"
            + (f"; outside: {', '.join(outside)}" if outside else "")
            + (". A dilated run is judged against the simulator of the network it emulates "
               "(its links K times slower); where that differs from the undilated network "
               "by more than the target, dilation itself changed what was measured (a "
               "window-limited connection keeps less of its buffers in flight on a slower "
               f"link): {', '.join(dilation)}" if dilation else "")
            + (f". Machine-bound at every dilation run, so not judged: {', '.join(bound)}"
               if bound else "")
            + (f". One GPU, no network, so not judged (microseconds of modeled compute "
               f"against the emulator's Python per iteration): {', '.join(alone)}"
               if alone else "")
            + (". K auto: what `--dilation auto` picked or, where its run was machine-bound, "
               "what that run suggested (marked so), as a user told `try --dilation N` goes "
               "on" if any((row.get("auto") or {}).get("followed") for row in rows) else "")
            + ". One run per cell"
            + (f", the median of several where said ({', '.join(repeated)})" if repeated else "")
            + f"; emulated at commit{'s' if len(commits) > 1 else ''} "
            + ", ".join(commits)
            + (f", simulated again at {', '.join(simulated)}" if simulated else "") + ".")


def _blocks(row: dict[str, Any]) -> list[dict[str, Any]]:
    """A row's emulated runs: at K=1, and at K auto where that is another."""
    k1, auto = row.get("k1"), row.get("auto")
    return [b for b in (k1, None if auto == k1 else auto) if b is not None]


def _k(auto: dict[str, Any] | None) -> str:
    if auto is None:
        return "-"
    return f"{auto['dilation']}" + (" (suggested)" if auto.get("followed") else "")


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| topology | policy | plan | simulated | emulated, K=1 | error | K auto | "
             "emulated, K auto | error |", "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        sim = row["simulated_s"]
        head = (f"| {row['topology']} | {row['policy']} | {row['plan']} | "
                f"{'-' if sim is None else f'{sim:.3f} s'} |")
        if "skipped" in row:
            lines.append(f"{head} not run ({row['skipped']}) | | | | |")
            continue
        auto, alone = row.get("auto"), _one_gpu(row)
        lines.append(f"{head} {_cell(row['k1'], sim, alone)} "
                     f"{_k(auto)} | {_cell(auto, sim, alone)}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
