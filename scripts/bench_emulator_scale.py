#!/usr/bin/env python3
"""The emulator past 16 GPUs: 16, 32 and 64 emulated GPUs on this machine at the dilation
`auto` picks, each run's median iteration against the simulator's, with the memory it
held and how busy the machine was (by this run, and by everything else on it).

Run as root: `.venv/bin/python scripts/bench_emulator_scale.py [--gpus 16,32,64]
[--repeat 3] [--policy gpipe] [--json benchmarks/emulator-scale.json]`; `--readme`
prints the table of docs/training.md from the JSON without running anything.

The topologies are generated (`scale_topology`): four DCs of GPUS/4 A100s, every pair
joined by a 1 Gbit/s link 10-70 ms long, paper-3dc's TCP; a 24-layer GPT (hidden 1024,
2 MB of activations per microbatch), 8 microbatches per replica, 4 iterations (the first
excluded). Each run is `testbed up --compute emulated --dilation auto` in a child
process while this one holds the root lock (/tmp/tb-root.lock), for that run only, so
others' root work can go between runs. The machine's load, over the run once the lock is
held: its busy share from /proc/stat, this run's own share (the child's CPU time with
its coordinator, workers and delay lines) and the load average before it.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from testbed.emulator.runtime.coordinator.health import busy_share, read_cpu

ROOT = Path(__file__).resolve().parent.parent
os.environ["TESTBED_PLANNING_STORE"] = "off"  # every search timed as a first: none read back
LOCK = "/tmp/tb-root.lock"
DCS = ["sjc", "ord", "iad", "ams"]
LATENCY_MS = {("sjc", "ord"): 20, ("ord", "iad"): 10, ("iad", "ams"): 40, ("sjc", "iad"): 30,
              ("ord", "ams"): 45, ("sjc", "ams"): 70}


def scale_topology(gpus: int) -> dict[str, Any]:
    return {
        "name": f"scale-{gpus}",
        "tcp": {"congestion": "cubic", "rmem": ["4KiB", "128KiB", "6MiB"],
                "wmem": ["4KiB", "16KiB", "4MiB"], "slow_start_after_idle": True},
        "datacenters": [{"name": dc, "gpus": gpus // len(DCS), "gpu": "a100",
                         "bandwidth": "100Gbit", "latency": "50us"} for dc in DCS],
        "wan": [{"between": [a, b], "latency": f"{ms}ms", "bandwidth": "1Gbit"}
                for (a, b), ms in LATENCY_MS.items()],
        "job": {"model": {"layers": 24, "hidden": 1024, "heads": 16, "seq_len": 1024,
                          "vocab": 50257},
                "microbatch_size": 1, "microbatches": 8, "iterations": 4, "seed": 0},
    }


def testbed(*args: str) -> list[str]:
    return [sys.executable, "-c", "from testbed.cli.main import main; main()", *args]


def one_run(topology: Path, policy: str, out: Path) -> dict[str, Any]:
    """One emulated run under the root lock, with the machine's load around it."""
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # as flock(1) takes it
        load = os.getloadavg()
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu, started = read_cpu(), time.monotonic()
        done = subprocess.run(testbed(
            "up", str(topology), "-p", policy, "--compute", "emulated", "--dilation",
            "auto", "--out", str(out)), capture_output=True, text=True)
        wall = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        busy = busy_share(cpu, read_cpu())
    ours = (after.ru_utime + after.ru_stime - children.ru_utime - children.ru_stime)
    if done.returncode != 0:
        return {"status": "failed", "error": (done.stderr or done.stdout).strip()[-2000:]}
    results = json.loads((out / "results.json").read_text())
    emulation, memory = results["emulation"], results["memory"]
    auto = next((line for line in (done.stdout + done.stderr).splitlines()
                 if line.startswith("dilation auto:")), None)
    return {
        "status": results["status"], "dilation": results["dilation"], "auto": auto,
        "plan": f"dp {results['plan']['dp']} x pp {results['plan']['pp']}",
        "median_s": results["iteration_time_s"]["median"],
        "iterations_s": results["iteration_time_s"]["all"],
        "predicted_s": results["predicted_iteration_s"],
        "error": results["prediction_error"],
        "cpu_bound": emulation["cpu_bound"], "reasons": emulation["reasons"],
        "suggested_dilation": emulation["suggested_dilation"],
        "cpu_busy_training": emulation["cpu_busy"], "workers_cpu": emulation["workers_cpu"],
        "span_cpu_s": emulation.get("span_cpu_s"),
        "machine_busy": round(busy, 3),
        "this_run_cpu": round(ours / (wall * len(os.sched_getaffinity(0))), 3),
        "loadavg_before": load,
        "memory": memory, "wall_s": round(wall, 1),
    }


def bench(sizes: list[int], repeat: int, policy: str, scratch: Path,
          written: Path) -> dict[str, Any]:
    """Every run in turn; the JSON rewritten after each, so what finished is kept if the
    rest is cut short (others' root work can keep the lock for long)."""
    out: dict[str, Any] = {"policy": policy, "repeat": repeat,
                           "machine": {"cores": len(os.sched_getaffinity(0)),
                                       "memory_bytes": os.sysconf("SC_PAGE_SIZE")
                                       * os.sysconf("SC_PHYS_PAGES")},
                           "topology": {str(g): scale_topology(g) for g in sizes},
                           "sizes": {}}
    for attempt in range(repeat):  # sizes in turn, so the machine's mood spreads over all
        for gpus in sizes:
            topology = scratch / f"scale-{gpus}.yaml"
            topology.write_text(yaml.safe_dump(scale_topology(gpus)))
            result = one_run(topology, policy, scratch / f"run-{gpus}-{attempt}")
            entry = out["sizes"].setdefault(str(gpus), {"runs": []})
            entry["runs"].append(result)
            entry.update(summarize(entry["runs"]))
            written.write_text(json.dumps(out, indent=1) + "\n")
            print(json.dumps({"gpus": gpus, "attempt": attempt, **result}), flush=True)
    return out


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if r["status"] == "ok" and r["median_s"] is not None]
    if not ok:
        return {}
    errors = [r["error"] for r in ok]
    return {"predicted_s": ok[0]["predicted_s"], "dilations": sorted({r["dilation"] for r in ok}),
            "median_s": statistics.median(r["median_s"] for r in ok),
            "medians_s": [r["median_s"] for r in ok],
            "error_median": statistics.median(errors), "error_min": min(errors),
            "error_max": max(errors),
            "workers_peak_bytes": max(r["memory"]["workers_peak_bytes"] for r in ok),
            "largest_worker_bytes": max(r["memory"]["largest_worker_bytes"] for r in ok),
            "predicted_bytes": ok[0]["memory"]["predicted"]["total_bytes"],
            "machine_busy": [r["machine_busy"] for r in ok],
            "this_run_cpu": [r["this_run_cpu"] for r in ok],
            "loadavg_before": [r["loadavg_before"][0] for r in ok]}


def readme(data: dict[str, Any]) -> str:
    lines = ["| GPUs | plan | dilation (auto) | simulated | emulated, median of runs "
             "(range) | error (range) | workers' memory at peak (largest) | machine busy "
             "(this run) | load before |", "|---|---|---|---|---|---|---|---|---|"]
    for gpus, entry in data["sizes"].items():
        if "median_s" not in entry:
            lines.append(f"| {gpus} | failed: {entry['runs'][0].get('error', '')[:80]} |")
            continue
        plan = next(r["plan"] for r in entry["runs"] if r["status"] == "ok")
        lines.append(
            f"| {gpus} | {plan} | {'/'.join(map(str, entry['dilations']))} "
            f"| {entry['predicted_s']:.3f} s | {entry['median_s']:.3f} s "
            f"({min(entry['medians_s']):.3f}-{max(entry['medians_s']):.3f}) "
            f"| {entry['error_median']:+.1%} ({entry['error_min']:+.1%} to "
            f"{entry['error_max']:+.1%}) "
            f"| {entry['workers_peak_bytes'] / 1e9:.2f} GB "
            f"({entry['largest_worker_bytes'] / 1e6:.0f} MB) "
            f"| {_span(entry['machine_busy'])} ({_span(entry['this_run_cpu'])}) "
            f"| {_span(entry['loadavg_before'], '.1f')} |")
    return "\n".join(lines)


def _span(values: list[float], fmt: str = ".0%") -> str:
    low, high = min(values), max(values)
    return f"{low:{fmt}}" if f"{low:{fmt}}" == f"{high:{fmt}}" else f"{low:{fmt}}-{high:{fmt}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--gpus", default="16,32,64")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--policy", default="gpipe")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "emulator-scale.json")
    parser.add_argument("--readme", action="store_true",
                        help="print the documentation's table from --json and stop")
    args = parser.parse_args()
    if args.readme:
        print(readme(json.loads(args.json.read_text())))
        return
    with tempfile.TemporaryDirectory() as tmp:
        result = bench([int(g) for g in args.gpus.split(",")], args.repeat, args.policy,
                       Path(tmp), args.json)
    print(readme(result))


if __name__ == "__main__":
    main()
