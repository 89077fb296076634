#!/usr/bin/env python3
"""The simulator: how fast it runs at paper scale, end to end as a user runs it and its
core alone, and how close it is to the emulator.

`.venv/bin/python scripts/bench_sim.py [--repeat 3] [--skip-emulator] [--sizes 8192x8,...]
[--e2e 8192x8,...] [--atlas GPUS] [--bubbles] [--against REV] [--json F]`
(the emulator part needs root). Prints markdown tables:
1. wall time to simulate one iteration of GPT-3 175B (tp 8, pp 16, 1F1B) from 128 to
   32,768 GPUs with 8, 32 and 128 microbatches (up to a million GPU-microbatches), and how
   the cost grows with the GPU count at 8 microbatches (the exponent of a power law fit
   from 4,096 GPUs up); with `--atlas GPUS`, Atlas's planning and simulation there;
2. with `--e2e`, `testbed simulate` on the same GPT-3 topologies written to a temporary
   directory (a new process each, planning, simulating and writing every file), timed as
   a user would, beside the core (the simulator's run alone, in this process) measured
   right after it, with the machine's load average; with `--atlas`, `testbed simulate -p
   atlas` there too; with `--bubbles`, BubbleTea at 400 requests/s on paper-3dc against
   real time; each of these two twice, the first run searching Atlas's plan and the same
   run again reading it back (testbed.common.memo); every run with Python's bytecode kept,
   as a user's install has it; with `--against REV`, each round of these two also runs them
   as commit REV has them (a git worktree of it, removed at the end), in turn with this
   checkout's, so that their ratio comes from the same minutes of this machine;
3. simulated vs emulated iteration time (emulated compute) for each shipped emulator
   topology and baseline policy, with the FLOP model and with a profile measured by the
   emulated run itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from testbed.common.yamlio import to_yaml
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.experiments.sweep import vary
from testbed.job.load import dump_job
from testbed.job.model import Job
from testbed.policy import training_policy
from testbed.report.profile import profile_from_spans
from testbed.sim.simulate import simulate_plan
from testbed.sim.simulator import Simulator
from testbed.topology import Topology, dump_topology

ROOT = Path(__file__).resolve().parent.parent


DEFAULT_SIZES = tuple((gpus, m) for gpus in (128, 1024, 4096, 8192, 16384, 32768)
                      for m in (8, 32, 128) if gpus * m <= 2**20)


def gpt3(gpus: int, microbatches: int, iterations: int = 1) -> tuple[Topology, Job]:
    """GPT-3 175B on `gpus` H100s: 4 DCs of GPUs/4, dp GPUs/128 (tp 8, pp 16), as
    gpt3-4dc.yaml has it at 1,024."""
    inputs = load_inputs(ROOT / "topologies" / "gpt3-4dc.yaml",
                         sets=(f"iterations={iterations}",))
    topology = replace(inputs.topology, name=f"gpt3-{gpus}", datacenters=tuple(
        replace(dc, gpus=gpus // 4) for dc in inputs.topology.datacenters))
    _, job = vary(topology, inputs.job, "dp", str(gpus // 128))
    _, job = vary(topology, job, "microbatches", str(microbatches))
    return topology, job


def core_s(topology: Topology, job: Job, policy_name: str = "1f1b") -> dict[str, Any]:
    """The simulator's run alone (the plan made first, not timed)."""
    policy = training_policy(policy_name)
    plan = plan_with_simulator(policy, topology, job)
    started, cpu = time.perf_counter(), time.process_time()
    result = Simulator(topology, job, plan, policy).run()
    return {"wall_s": time.perf_counter() - started, "cpu_s": time.process_time() - cpu,
            "spans": len(result.spans), "events": result.events}


def scale_table(sizes: tuple[tuple[int, int], ...] = DEFAULT_SIZES) -> list[dict[str, Any]]:
    """(GPUs, microbatches) each: the core's wall time (`gpt3`)."""
    rows = []
    for gpus, microbatches in sizes:
        topology, job = gpt3(gpus, microbatches)
        rows.append({"gpus": gpus, "dp": gpus // 128, "microbatches": microbatches,
                     **core_s(topology, job)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def user_env(kept: Path | None = None) -> dict[str, str]:
    """A user's environment: Python keeps compiled bytecode (as an installed package has it;
    PYTHONDONTWRITEBYTECODE would compile every module again each run), and plan searches
    are kept in `kept` (a fresh folder: the first run searches, the same run again reads
    its answer back), or none when `kept` is None."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    if kept is None:
        env["TESTBED_PLANNING_STORE"] = "off"
    else:
        env.update(TESTBED_PLANNING_STORE="on", TESTBED_PLANNING_STORE_DIR=str(kept))
    return env


def compile_once(root: Path = ROOT) -> None:
    """testbed's bytecode written before any timed run (a user's first run after
    installing pays this once)."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(root / "testbed"),
                    str(root / "plugins")], check=True, env=user_env())


@dataclass(frozen=True)
class Code:
    """Which testbed a timed command runs: this checkout's (no `rev`), or commit `rev`'s,
    found first on the Python path (`env`)."""

    rev: str | None = None
    env: dict[str, str] = field(default_factory=dict)


@contextlib.contextmanager
def code_at(rev: str) -> Iterator[Code]:
    """Commit `rev`'s testbed and plugins, in a git worktree that is removed at the end:
    its folders go first on PYTHONPATH (the plugins under the name the installed entry
    points import, `testbed_plugins`), ahead of this checkout's installed ones."""
    full = subprocess.run(["git", "rev-parse", "--short=10", f"{rev}^{{commit}}"], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if full.returncode:
        raise SystemExit(f"bench_sim: --against {rev}: not a commit of this repository")
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree),
                        full.stdout.strip()], cwd=ROOT, check=True)
        try:
            (Path(tmp) / "path").mkdir()
            (Path(tmp) / "path" / "testbed_plugins").symlink_to(tree / "plugins")
            compile_once(tree)
            yield Code(full.stdout.strip(),
                       {"PYTHONPATH": os.pathsep.join((str(tree), f"{tmp}/path"))})
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                           check=False)


def testbed_simulate(topology: Topology, job: Job, work: Path, *args: str,
                     kept: Path | None = None, code: Code = Code()) -> dict[str, Any]:
    """`testbed simulate` on this topology and job written to `work`, in a new process,
    timed from start to exit; its results.json and the load average before and after.
    `kept`: the folder of kept plan searches (see `user_env`); `code`: whose testbed."""
    path = work / f"{topology.name}.yaml"
    path.write_text(to_yaml({**dump_topology(topology), "job": dump_job(job)}))
    testbed = str(Path(sys.executable).parent / "testbed")
    load = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([testbed, "simulate", str(path), "--out", str(work / "run"),
                           "--force", *args], capture_output=True, text=True, check=False,
                          env={**user_env(kept), **code.env})
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    if done.returncode:
        raise SystemExit(f"testbed simulate failed: {done.stderr.strip()}")
    results = json.loads((work / "run" / "results.json").read_text())
    return {"e2e_s": wall, "e2e_cpu_s": cpu,
            "load": [round(load, 2), round(os.getloadavg()[0], 2)], "results": results}


def e2e_table(sizes: tuple[tuple[int, int], ...], repeat: int) -> list[dict[str, Any]]:
    """Per size, `repeat` times: `testbed simulate` end to end, then the core alone; the
    ratio of the two from the same round (the machine is shared: its load moves both)."""
    rows = []
    for gpus, microbatches in sizes:
        topology, job = gpt3(gpus, microbatches)
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as tmp:
                run = testbed_simulate(topology, job, Path(tmp))
            core = core_s(topology, job)
            rows.append({"gpus": gpus, "microbatches": microbatches,
                         "e2e_s": run["e2e_s"], "core_s": core["wall_s"],
                         "ratio": run["e2e_s"] / core["wall_s"], "e2e_cpu_s": run["e2e_cpu_s"],
                         "core_cpu_s": core["cpu_s"],
                         "cpu_ratio": run["e2e_cpu_s"] / core["cpu_s"],
                         "events": core["events"], "load": run["load"]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def e2e_text(rows: list[dict[str, Any]]) -> str:
    """Each size's best round (least disturbed by the machine's other work), and the
    growth of end-to-end time at 8 microbatches from 4,096 GPUs up."""
    best: dict[tuple[int, int], dict[str, Any]] = {}
    for row in rows:
        key = (row["gpus"], row["microbatches"])
        if key not in best or row["e2e_s"] < best[key]["e2e_s"]:
            best[key] = row
    lines = ["| GPUs x microbatches | `testbed simulate` | core | ratio | CPU: e2e | core | "
             "ratio | rounds (e2e s) | load |", "|---|---|---|---|---|---|---|---|---|"]
    for (gpus, m), row in sorted(best.items()):
        rounds = ", ".join(f"{r['e2e_s']:.2f}" for r in rows
                           if (r["gpus"], r["microbatches"]) == (gpus, m))
        lines.append(f"| {gpus:,} x {m} | {row['e2e_s']:.2f} s | {row['core_s']:.2f} s | "
                     f"{row['ratio']:.2f}x | {row['e2e_cpu_s']:.2f} s | {row['core_cpu_s']:.2f} s"
                     f" | {row['cpu_ratio']:.2f}x | {rounds} | {row['load'][0]:.1f} |")
    growth = [{"gpus": g, "e2e_s": r["e2e_s"]} for (g, m), r in sorted(best.items())
              if m == 8 and g >= 4096]
    if len(growth) >= 2:
        lines.append(f"\nGrowth end to end at 8 microbatches, {growth[0]['gpus']:,} to "
                     f"{growth[-1]['gpus']:,} GPUs: ~ GPUs^{_slope(growth, 'e2e_s'):.2f}")
    return "\n".join(lines)


def first_and_again(topology: Topology, job: Job, *args: str, code: Code = Code()
                    ) -> list[dict[str, Any]]:
    """The same `testbed simulate` twice with a fresh folder of kept plan searches: the
    first run searches (`planning: "searched"`), the second reads its answer back
    (`"kept"`); both write every file."""
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(2):
            run = testbed_simulate(topology, job, Path(tmp), *args, kept=Path(tmp) / "kept",
                                   code=code)
            notes = run["results"]["plan"]["notes"]
            run["planning"] = "kept" if notes["planning_kept"] else "searched"
            run["planning_s"] = notes["planning_s"]
            run["code"] = code.rev or "this"
            runs.append(run)
    return runs


def in_turn(repeat: int, codes: list[Code]) -> Iterator[Code]:
    """Each round, every code once, the order turning round by round (so none always runs
    first after the last one's load)."""
    for i in range(repeat):
        shift = i % len(codes)
        yield from codes[shift:] + codes[:shift]


def atlas_e2e(gpus: int, repeat: int, codes: list[Code], microbatches: int = 8
              ) -> list[dict[str, Any]]:
    """`testbed simulate -p atlas` at `gpus` (planning, two iterations, every file): its
    first run, and the same run again, with each of `codes` every round."""
    topology, job = gpt3(gpus, microbatches, iterations=2)
    rows = []
    for code in in_turn(repeat, codes):
        for run in first_and_again(topology, job, "-p", "atlas", code=code):
            rows.append({"gpus": gpus, "e2e_s": run["e2e_s"], "e2e_cpu_s": run["e2e_cpu_s"],
                         "planning": run["planning"], "planning_s": run["planning_s"],
                         "cores": os.cpu_count(), "load": run["load"], "code": run["code"],
                         "iteration_s": run["results"]["iteration_time_s"]["median"]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def bubbles_e2e(repeat: int, codes: list[Code]) -> list[dict[str, Any]]:
    """BubbleTea at 400 requests/s on paper-3dc with Atlas (4 iterations), end to end,
    against the training time it represents: its first run, and the same run again, with
    each of `codes` every round."""
    inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml",
                         sets=("inference.arrival_rate=400/s", "iterations=4"))
    rows = []
    for code in in_turn(repeat, codes):
        for run in first_and_again(inputs.topology, inputs.job, "-p", "atlas",
                                   "-b", "bubbletea", code=code):
            represented = sum(run["results"]["iteration_time_s"]["all"])
            rows.append({"e2e_s": run["e2e_s"], "e2e_cpu_s": run["e2e_cpu_s"],
                         "planning": run["planning"], "planning_s": run["planning_s"],
                         "represented_s": represented,
                         "faster_than_real_time": represented / run["e2e_s"],
                         "load": run["load"], "code": run["code"],
                         "util_total": run["results"]["gpu_utilization"]["total"]})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def speed_table(rows: list[dict[str, Any]]) -> str:
    """CPU seconds, GPUs down, microbatches across; then the growth exponent at 8
    microbatches."""
    columns = sorted({r["microbatches"] for r in rows})
    cpu = {(r["gpus"], r["microbatches"]): r["cpu_s"] for r in rows}
    lines = ["| GPUs | " + " | ".join(f"{m} microbatches" for m in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for gpus in sorted({r["gpus"] for r in rows}):
        cells = [f"{cpu[gpus, m]:.2f} s" if (gpus, m) in cpu else "not run" for m in columns]
        lines.append(f"| {gpus:,} | " + " | ".join(cells) + " |")
    base = [r for r in sorted(rows, key=lambda r: r["gpus"])
            if r["microbatches"] == 8 and r["gpus"] >= 4096]
    if len(base) >= 2:
        lines.append(f"\nGrowth at 8 microbatches, {base[0]['gpus']:,} to "
                     f"{base[-1]['gpus']:,} GPUs: CPU time ~ GPUs^{_slope(base, 'cpu_s'):.2f}, "
                     f"events ~ GPUs^{_slope(base, 'events'):.2f}; per event "
                     + ", ".join(f"{r['cpu_s'] / r['events'] * 1e6:.1f} us" for r in base))
    return "\n".join(lines)


def _slope(rows: list[dict[str, Any]], key: str) -> float:
    """The exponent of a power law through (GPUs, rows[key]), least squares in logs."""
    return statistics.linear_regression([math.log(r["gpus"]) for r in rows],
                                        [math.log(r[key]) for r in rows]).slope


def atlas_at(gpus: int, microbatches: int = 8) -> dict[str, Any]:
    """Atlas's plan search and one simulation of its plan at `gpus` (the scale setup)."""
    topology, job = gpt3(gpus, microbatches, iterations=2)
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
    from testbed.emulator.runtime.coordinator.coordinator import Coordinator
    from testbed.emulator.runtime.coordinator.run_config import RunConfig
    from testbed.emulator.runtime.coordinator.signals import run_with_signals
    from testbed.plan.host_tcp import hosts_as_planned

    rows = []
    for name, iterations in (("two-dc", 8), ("paper-3dc", 4)):
        if name not in topologies:
            continue
        for policy_name in ("gpipe", "1f1b"):
            inputs = load_inputs(ROOT / "topologies" / f"{name}.yaml",
                                 sets=(f"iterations={iterations}",))
            policy = training_policy(policy_name)
            plan = plan_with_simulator(policy, inputs.topology, inputs.job)
            topology = hosts_as_planned(inputs.topology, plan)  # as `testbed up` runs it
            emulated, spans = [], []
            for _ in range(repeat):
                with tempfile.TemporaryDirectory() as tmp:
                    config = RunConfig(topology, inputs.job, plan, policy, "emulated",
                                       Path(tmp) / "logs")
                    outcome = asyncio.run(run_with_signals(
                        Coordinator(config, say=lambda _m: None)))
                emulated.append(outcome.summary.median_s)
                spans += outcome.spans
            modeled, _ = simulate_plan(topology, inputs.job, plan, policy)
            profiled, _ = simulate_plan(topology, inputs.job, plan, policy,
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
    parser.add_argument("--repeat", type=int, default=3,
                        help="emulator runs per case, and end-to-end rounds per size")
    parser.add_argument("--skip-emulator", action="store_true")
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument("--sizes", help="GPUSxMICROBATCHES,... for the speed table "
                        "(default: 128, 1024 and 8192 GPUs with 8, 32 and 128)")
    parser.add_argument("--atlas", type=int, metavar="GPUS",
                        help="also time Atlas's planning and simulation at this many GPUs")
    parser.add_argument("--e2e", help="GPUSxMICROBATCHES,... to time `testbed simulate` on, "
                        "each beside its core (repeated --repeat times)")
    parser.add_argument("--bubbles", action="store_true",
                        help="also time BubbleTea at 400 requests/s on paper-3dc end to end")
    parser.add_argument("--against", metavar="REV",
                        help="also run the end-to-end Atlas and BubbleTea cases as commit REV "
                        "has them, in turn with this checkout's")
    parser.add_argument("--topologies", default="two-dc,paper-3dc",
                        help="emulator topologies to compare against (comma-separated)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    compile_once()
    results: dict[str, Any] = {"scale": [] if args.skip_scale else scale_table(
        _sizes(args.sizes) if args.sizes else DEFAULT_SIZES)}
    if results["scale"]:
        print(speed_table(results["scale"]))
    if args.e2e:
        results["e2e"] = e2e_table(_sizes(args.e2e), args.repeat)
        print(e2e_text(results["e2e"]))
    if args.atlas:
        results["atlas"] = atlas_at(args.atlas)
    with contextlib.ExitStack() as stack:
        codes = [Code()]
        if args.against:
            codes.append(stack.enter_context(code_at(args.against)))
            results["reference"] = codes[-1].rev
        if args.atlas and args.e2e:
            results["atlas_e2e"] = atlas_e2e(args.atlas, args.repeat, codes)
        if args.bubbles:
            results["bubbles_e2e"] = bubbles_e2e(args.repeat, codes)
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
