#!/usr/bin/env python3
"""Scenarios measured: iteration time and goodput (tokens/s over the whole run, failures
included) of GPipe, Atlas and DiLoCo on two-dc under a measured-style WAN trace and under
one failure (restarted, and replanned), emulated and simulated side by side.

two-dc with GPT-2 (6.3 MB activations, 8 microbatches: the 1 Gbit/s link, not this
machine, sets GPipe's pace), each policy run for about `--seconds` of represented time
when nothing happens (its iterations chosen from a calm simulated run; DiLoCo syncs every
20 steps), the conditions:
- calm: the topology as it is;
- trace: scenarios/two-dc-wan-trace.yaml (the link follows scenarios/wan-trace.csv);
- restart, replan: scenarios/two-dc-lose-a-worker.yaml (east-1 lost 12 s into training,
  back 8 s later; 1 s to notice, 5 s to start again), checkpoints every 5 s or so, and
  `--on-failure restart` or `replan`.

As root: `.venv/bin/python scripts/bench_scenarios.py [--policies gpipe,atlas,diloco]
[--backends simulate,emulate] [--seconds 30] [--json benchmarks/scenarios.json]
[--readme docs/scenarios.md]`; `--from-json F --backends ''` only rewrites the page's table.
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
from testbed.run.spec import RunSpec

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGY = ROOT / "topologies" / "two-dc.yaml"
SETS = ("model=gpt2", "microbatches=8")
OPTIONS = {"diloco": {"inner_steps": "20"}}
CONDITIONS = {"calm": (None, "stop"),
              "trace": (ROOT / "scenarios" / "two-dc-wan-trace.yaml", "stop"),
              "restart": (ROOT / "scenarios" / "two-dc-lose-a-worker.yaml", "restart"),
              "replan": (ROOT / "scenarios" / "two-dc-lose-a-worker.yaml", "replan")}

def sizes(policy: str, seconds: float, scratch: Path) -> tuple[int, int, int]:
    """(iterations, period, checkpoint interval) for a calm run of about `seconds`."""
    inputs = load_inputs(TOPOLOGY, sets=(*SETS, "iterations=4"))
    probe = run(RunSpec.build("simulate", inputs.topology, inputs.job, policy=policy,
                              policy_options=OPTIONS.get(policy, {})), scratch / f"probe-{policy}")
    assert probe.record is not None
    period = probe.record.plan.period
    cycle_s = probe.record.summary.cycle_s or probe.record.summary.typical_s or 1.0
    if period == 1:
        cycle_s = probe.record.summary.typical_s or 1.0
    cycles = max(2, round(seconds / cycle_s))
    every = max(1, round(5.0 / cycle_s)) * period
    return cycles * period, period, every


def one_run(policy: str, condition: str, backend: str, iterations: int, every: int,
            scratch: Path) -> dict[str, Any]:
    scenario, on_failure = CONDITIONS[condition]
    inputs = load_inputs(TOPOLOGY, scenario=scenario, sets=(*SETS, f"iterations={iterations}"))
    spec = RunSpec.build(backend, inputs.topology, inputs.job, policy=policy,
                         policy_options=OPTIONS.get(policy, {}), compute="emulated",
                         events=inputs.events, scenario=inputs.scenario, on_failure=on_failure,
                         checkpoint_every=every if on_failure != "stop" else 0)
    started = time.monotonic()
    outcome = run(spec, scratch / f"{policy}-{condition}-{backend}", print)
    results = outcome.results
    failures = results.get("failures") or []
    return {"status": results["status"], "error": results["error"],
            "iterations": results["iterations"],
            "median_s": results["iteration_time_s"]["median"],
            "tokens_per_s": results["tokens_per_s"],
            "goodput_tokens_per_s": results["goodput_tokens_per_s"],
            "tokens": results["tokens"]["total"],
            "time_lost_s": results.get("time_lost_s"),
            "plan": f"dp {results['plan']['dp']} x pp {results['plan']['pp']}",
            "plan_after": [f"dp {f['plan_after']['dp']} x pp {f['plan_after']['pp']}"
                           for f in failures if f.get("plan_after")],
            "resumed_from": [f["resumed_from"] for f in failures],
            "machine_bound": bool((results.get("emulation") or {}).get("cpu_bound")),
            "wall_s": time.monotonic() - started}


def measure(policies: list[str], backends: list[str], seconds: float, scratch: Path,
            report: dict[str, Any]) -> None:
    for policy in policies:
        iterations, period, every = sizes(policy, seconds, scratch)
        entry = report.setdefault(policy, {})
        entry.update(iterations=iterations, period=period, checkpoint_every=every)
        for condition in CONDITIONS:
            for backend in backends:
                cell = one_run(policy, condition, backend, iterations, every, scratch)
                entry.setdefault(condition, {})[backend] = cell
                print(json.dumps({"policy": policy, "condition": condition,
                                  "backend": backend, **cell}), flush=True)


def _cell(row: dict[str, Any] | None, key: str, unit: str) -> str:
    if row is None or row.get(key) is None:
        return "-"
    value = row[key]
    text = f"{value:.3f} s" if unit == "s" else f"{value:,.0f}"
    return text + ("*" if row.get("machine_bound") and unit == "s" else "")


def table(report: dict[str, Any]) -> str:
    lines = ["| policy | condition | plan | iteration, simulated | iteration, emulated | "
             "goodput, simulated | goodput, emulated | time lost, simulated | "
             "time lost, emulated |", "|---|---|---|---|---|---|---|---|---|"]
    for policy, entry in report.items():
        for condition in CONDITIONS:
            cells = entry.get(condition)
            if not cells:
                continue
            sim, emu = cells.get("simulate"), cells.get("emulate")
            some = sim or emu or {}
            plan = some.get("plan", "-")
            if some.get("plan_after"):
                plan += " -> " + ", ".join(some["plan_after"])
            lost = [_cell(r, "time_lost_s", "s") if condition in ("restart", "replan")
                    else "-" for r in (sim, emu)]
            lines.append(
                f"| {policy} | {condition} | {plan} | {_cell(sim, 'median_s', 's')} | "
                f"{_cell(emu, 'median_s', 's')} | {_cell(sim, 'goodput_tokens_per_s', '')} | "
                f"{_cell(emu, 'goodput_tokens_per_s', '')} | {lost[0]} | {lost[1]} |")
    return "\n".join(lines)


def write_readme(page: Path, report: dict[str, Any], source: Path | None) -> None:
    """The table into `page` (docs/...) between its markers, stamped with the commit
    of `source`, the JSON it came from (scripts/docs_tables.py does the same from the JSON)."""
    from docs_tables import write_block

    write_block(page, "scenarios", table(report), [] if source is None else [source])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--policies", default="gpipe,atlas,diloco")
    parser.add_argument("--backends", default="simulate,emulate")
    parser.add_argument("--seconds", type=float, default=30.0,
                        help="represented seconds of a calm run of each policy")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "scenarios.json")
    parser.add_argument("--from-json", type=Path, help="start from this report")
    parser.add_argument("--readme", type=Path, metavar="PAGE.md",
                        help="rewrite the table between the markers of this page "
                        "(docs/scenarios.md)")
    args = parser.parse_args()
    report: dict[str, Any] = json.loads(args.from_json.read_text()) if args.from_json else {}
    backends = [b for b in args.backends.split(",") if b]
    if backends:
        with tempfile.TemporaryDirectory() as tmp:
            measure(args.policies.split(","), backends, args.seconds, Path(tmp),
                    report.setdefault("runs", {}))
        report["seconds"] = args.seconds
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report.get("runs", {})))
    if args.readme:
        write_readme(args.readme, report.get("runs", {}),
                     args.json if backends else args.from_json)


if __name__ == "__main__":
    main()
