"""`testbed simulate`, `testbed profile` and `testbed sweep`: the same plans at paper scale."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

import click

from testbed.api import check, run
from testbed.cli_options import (
    bubble_options,
    event_options,
    force_option,
    jitter_option,
    job_flags,
    job_options,
    plan_option,
    policy_option,
    policy_options,
    results_dir,
    target_loss_option,
    with_plan,
)
from testbed.errors import TestbedError
from testbed.fsutil import write_atomic
from testbed.inputs import load_inputs
from testbed.policy import parse_options, training_policy
from testbed.policy.registry import DEFAULT_POLICY, check_policies
from testbed.report.results import new_run_dir
from testbed.report.table import run_summary
from testbed.run_spec import RunSpec
from testbed.sim.jitter import Jitter
from testbed.sim.planning import plan_with_simulator, shared_cache
from testbed.sim.profile import load_profile, write_profile
from testbed.sim.simulate import simulate_plan
from testbed.sim.sweep import grid, parse_vary, vary

profile_option = click.option(
    "--profile", "profile_path", type=click.Path(dir_okay=False, path_type=Path),
    help="Per-stage compute times measured by a run (`testbed profile RUN_DIR`) instead of "
    "the FLOP model.")


@click.command()
@click.argument("topology", metavar="TOPOLOGY.yaml",
                type=click.Path(dir_okay=False, path_type=Path))
@policy_option
@policy_options
@plan_option
@bubble_options
@job_options
@event_options
@profile_option
@jitter_option
@target_loss_option
@force_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Results directory (default: a new one under runs/).")
def simulate(topology: Path, policy: str, policy_opts: tuple[str, ...], plan_path: Path | None,
             bubble: str | None, bubble_opts: tuple[str, ...], profile_path: Path | None,
             out: Path | None, force: bool, jitter: Jitter | None, target_loss: float | None,
             **kwargs: Any) -> None:
    """Simulate the plan at any scale: modeled compute, flow-level network.

    Compute times come from FLOPs and the GPU type's sustained rate (or --profile);
    transfers share links max-min fairly (or one at a time where the plan arbitrates),
    each TCP connection limited by its window and slow start. Writes the same
    results.json and trace.json as `testbed up` (backend simulate, compute modeled).
    With --plan FILE, runs that plan (saved, hand-edited, or torch's CSV form).
    """
    inputs = load_inputs(topology, **job_flags(kwargs))
    spec = RunSpec("simulate", inputs.topology, inputs.job, policy,
                   dict(parse_options(policy_opts)), bubble_policy=bubble,
                   bubble_options=dict(parse_options(bubble_opts)),
                   profile=load_profile(profile_path) if profile_path else None,
                   events=inputs.events,
                   jitter=jitter.with_seed(inputs.job.seed) if jitter else None,
                   target_loss=target_loss)
    spec = with_plan(spec, plan_path)
    check(spec)
    directory = results_dir(out, force, lambda: new_run_dir(inputs.topology.name, spec.policy))
    outcome = run(spec, directory, lambda message: click.echo(message, err=True))
    for line in run_summary(outcome.results):
        click.echo(line)
    click.echo(f"simulated in {outcome.results['wall_s']:.2f} s; results in {directory}")


@click.command()
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the profile (default: RUN_DIR/profile.json).")
def profile(run_dir: Path, output: Path | None) -> None:
    """Measure per-stage forward/backward times from a run, for `simulate --profile`, and
    how much compute and prefill times varied, for `simulate --jitter`."""
    target = output or run_dir / "profile.json"
    stages = write_profile(run_dir, target)
    for stage, times in stages.items():
        click.echo(f"stage {stage}: forward {times.get('forward_s', 0) * 1e3:.3f} ms, "
                   f"backward {times.get('backward_s', 0) * 1e3:.3f} ms")
    spread = json.loads(target.read_text())["spread"]
    measured = {k: v for k, v in spread.items() if v is not None}
    if measured:
        jitter = ",".join(f"{k}={v:.1%}" for k, v in measured.items())
        click.echo(f"measured spread (CV): {', '.join(f'{k} {v:.1%}' for k, v in measured.items())}"
                   f"; to simulate it: --jitter {jitter}")
    click.echo(f"profile written to {target}")


@click.command()
@click.argument("topology", metavar="TOPOLOGY.yaml",
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("-p", "--policy", "policies", multiple=True, default=(DEFAULT_POLICY,),
              show_default=True, help="Policies to compare. Repeatable.")
@click.option("--vary", "varies", multiple=True, required=True, metavar="KEY=V1,V2,...",
              help="What to change: wan.latency, wan.bandwidth, dcs (first N datacenters), "
              "or any job key (microbatches, model.layers, ...). Repeatable: every "
              "combination runs.")
@job_options
@profile_option
@force_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Directory for sweep.csv and sweep.png (default: a new one under runs/).")
def sweep(topology: Path, policies: tuple[str, ...], varies: tuple[str, ...],
          profile_path: Path | None, out: Path | None, force: bool,
          **kwargs: Any) -> None:
    """What-if sweep in the simulator: one CSV row per point and policy, and a plot.

    Example: testbed sweep topologies/paper-3dc.yaml -p gpipe -p atlas
    --vary wan.latency=10ms,20ms,40ms,80ms
    """
    inputs = load_inputs(topology, **job_flags(kwargs))
    check_policies([(name, {}) for name in policies])
    parsed = [parse_vary(v) for v in varies]
    profile_data = load_profile(profile_path) if profile_path else None
    points = grid(parsed)
    rows: list[dict[str, Any]] = []
    with click.progressbar(length=len(points) * len(policies), label="simulating",
                           file=sys.stderr) as bar, shared_cache() as cache:
        for point in points:
            topo, job = inputs.topology, inputs.job
            for key, value in point:
                topo, job = vary(topo, job, key, value)
            for name in policies:
                chosen = training_policy(name)
                row: dict[str, Any] = {"policy": name, **dict(point)}
                try:
                    plan = plan_with_simulator(chosen, topo, job, cache)
                    summary, _ = simulate_plan(topo, job, plan, chosen, profile_data)
                    row.update({"iteration_s": summary.median_s,
                                "tokens_per_s": summary.tokens_per_s,
                                "gpu_utilization": summary.utilization_training,
                                "wan_utilization": summary.wan_utilization,
                                "dp": plan.dp, "pp": plan.pp, "error": ""})
                except TestbedError as exc:
                    row.update({"iteration_s": None, "error": str(exc)})
                rows.append(row)
                bar.update(1)
    directory = results_dir(out, force, lambda: new_run_dir(inputs.topology.name, "sweep"))
    directory.mkdir(parents=True, exist_ok=True)
    fields = list(dict.fromkeys(k for row in rows for k in row))
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    write_atomic(directory / "sweep.csv", table.getvalue(), 0o644)
    from testbed.report.plots import sweep_plot

    sweep_plot(rows, [k for k, _ in parsed], directory / "sweep.png")
    for row in rows:
        label = ", ".join(f"{k}={row[k]}" for k, _ in parsed)
        value = f"{row['iteration_s']:.3f} s" if row.get("iteration_s") else row["error"]
        click.echo(f"{row['policy']:<14} {label:<40} {value}")
    click.echo(f"wrote {directory / 'sweep.csv'} and {directory / 'sweep.png'}")
