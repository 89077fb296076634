#!/usr/bin/env python3
"""The flow model's lasting share spread (testbed.plan.tcp_model.THRESHOLD_CV) fitted to
emulated runs, so the constant follows from real TCP, not from a hand's tuning.

What is fitted is how much the same connections stay slower than their replicas' over a
run (testbed.metrics.connection_spread, read from spans alike in both backends), not a
run's iteration time: the fidelity table (scripts/bench_fidelity.py) judges that.

  record RUN_DIR...   each emulated run's spread, topology, policy and iterations, read
                      from its results directory (`testbed up ... --out RUN_DIR`), into
                      the JSON
  fit                 every recorded run simulated at each CV of a grid, seeds 0 to
                      --seeds - 1; the CV whose mean simulated spreads come closest to
                      the emulated ones of the runs the machine did not bound (least
                      squares), rounded to DECIMALS, into the JSON (`fit`), with each
                      run's own best CV

`.venv/bin/python scripts/threshold_fit.py fit` prints the fit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from bench_fidelity import topology_file
from measured_at import commit

from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.metrics.connection_spread import connection_spread
from testbed.plan import tcp_model
from testbed.plan.jitter import Jitter
from testbed.policy.registry import training_policy
from testbed.sim.simulate import simulate_plan

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "benchmarks" / "connection-spread.json"
GRID = [round(0.02 * i, 2) for i in range(16)]
"""The CVs tried: 0 to 0.30."""
DECIMALS = 2
"""What the fitted CV is rounded to: the runs' spreads do not pin a closer one."""


def record(run_dirs: list[Path], path: Path) -> None:
    """Each run directory's entry, added to (or replacing the same directory's in) `path`."""
    data: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"runs": []}
    for run_dir in run_dirs:
        results = json.loads((run_dir / "results.json").read_text())
        if results["backend"] != "emulate":
            raise SystemExit(f"{run_dir}: a {results['backend']} run; record emulated ones")
        spans = json.loads((run_dir / "spans.json").read_text())["spans"]
        emulation = results.get("emulation") or {}
        entry = {"run": run_dir.name, "topology": results["topology"],
                 "policy": results["policy"], "iterations": results["iterations"],
                 "seed": results["seed"], "plan": _plan_text(results["plan"]),
                 "iteration_s": results["iteration_time_s"]["median"],
                 "machine_bound": bool(emulation.get("cpu_bound")),
                 "commit": commit(), "spread": connection_spread(spans)}
        data["runs"] = [r for r in data["runs"] if r["run"] != entry["run"]] + [entry]
        print(json.dumps(entry), flush=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


def _plan_text(plan: dict[str, Any]) -> str:
    return f"dp {plan['dp']} x pp {plan['pp']}"


def simulated_spreads(entry: dict[str, Any], seeds: int) -> dict[float, float]:
    """The entry's run simulated at each CV of GRID: the mean spread over the seeds."""
    inputs = load_inputs(topology_file(entry["topology"]))
    job = dataclasses.replace(inputs.job, iterations=entry["iterations"])
    policy = training_policy(entry["policy"])
    plan = plan_with_simulator(policy, inputs.topology, job)
    if _plan_text({"dp": plan.dp, "pp": plan.pp}) != entry["plan"]:
        raise SystemExit(f"{entry['run']}: plans {plan.dp} x {plan.pp} now, {entry['plan']} "
                         "when emulated: record the run again")
    kept = tcp_model.THRESHOLD_CV
    out = {}
    try:
        for cv in GRID:
            tcp_model.THRESHOLD_CV = cv  # read by threshold_cv at each pair's making
            spreads = [connection_spread(simulate_plan(inputs.topology, job, plan, policy,
                                                       jitter=Jitter(seed=seed))[1])
                       for seed in range(seeds)]
            out[cv] = statistics.fmean(s for s in spreads if s is not None)
    finally:
        tcp_model.THRESHOLD_CV = kept
    return out


def best(curves: list[tuple[dict[float, float], float]]) -> float:
    """The GRID CV of least squared error over (simulated spreads by CV, emulated)."""
    return min(GRID, key=lambda cv: sum((sim[cv] - emulated) ** 2 for sim, emulated in curves))


def fit(path: Path, seeds: int) -> float:
    data = json.loads(path.read_text())
    curves = []
    for entry in data["runs"]:
        if entry["spread"] is None:
            continue
        sim = simulated_spreads(entry, seeds)
        entry["simulated"] = {f"{cv:.2f}": value for cv, value in sim.items()}
        entry["own_best"] = best([(sim, entry["spread"])])
        if not entry["machine_bound"]:
            curves.append((sim, entry["spread"]))
        print(f"{entry['run']}: emulated {entry['spread']:.3f}, best alone "
              f"{entry['own_best']:.2f}{' (machine-bound: not fitted)' * entry['machine_bound']}",
              flush=True)
    fitted = round(best(curves), DECIMALS)
    data["fit"] = {"threshold_cv": fitted, "seeds": seeds, "commit": commit()}
    path.write_text(json.dumps(data, indent=1) + "\n")
    return fitted


def table(report: dict[str, Any]) -> str:
    """The recorded runs, their spreads emulated and simulated at the fitted CV, and the
    fit, as the docs show them."""
    fitted = report["fit"]["threshold_cv"]
    lines = ["| emulated run | topology | policy | plan | iteration | spread, emulated | "
             f"simulated at {fitted:.0%} (mean of {report['fit']['seeds']} seeds) | "
             "simulated without (per-message draws alone) | CV that run alone fits |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for entry in report["runs"]:
        bound = ", machine-bound: not fitted" if entry["machine_bound"] else ""
        own = f"{entry['own_best']:.2f}"
        if entry["own_best"] == GRID[-1] and entry["simulated"][own] < entry["spread"]:
            own = f"over {own}: no CV tried reaches it"
        lines.append(f"| {entry['run']} | {entry['topology']} | {entry['policy']} | "
                     f"{entry['plan']} | {entry['iteration_s']:.2f} s{bound} | "
                     f"{entry['spread']:.3f} | {entry['simulated'][f'{fitted:.2f}']:.3f} | "
                     f"{entry['simulated']['0.00']:.3f} | {own} |")
    fitted_runs = sum(not entry["machine_bound"] for entry in report["runs"])
    lines += ["", f"Fitted over the {fitted_runs} runs the machine did not bound: "
              f"THRESHOLD_CV = {fitted} (a CV of the grid 0-{GRID[-1]:.2f}, least squares "
              "on the spreads; each run's iterations from the second, as emulated)."]
    return "\n".join(lines)


def fitted_cv(path: Path = RECORDED) -> float:
    """The CV the last fit recorded."""
    return float(json.loads(path.read_text())["fit"]["threshold_cv"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("record", "fit"))
    parser.add_argument("run_dirs", nargs="*", type=Path)
    parser.add_argument("--json", type=Path, default=RECORDED)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    if args.part == "record":
        if not args.run_dirs:
            parser.error("record takes the emulated runs' directories")
        record(args.run_dirs, args.json)
    else:
        print(f"THRESHOLD_CV = {fit(args.json, args.seeds)}")


if __name__ == "__main__":
    main()
