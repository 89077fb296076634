"""`testbed simulate` and `testbed profile`: the same plans at paper scale."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from testbed.api import check, run
from testbed.cli.options import (
    bubble_options,
    checkpoint_option,
    event_options,
    force_option,
    jitter_option,
    job_flags,
    job_options,
    loss_model_option,
    plan_option,
    policy_option,
    policy_options,
    results_dir,
    run_verbosity_option,
    scenario_options,
    target_loss_option,
    trace_option,
    with_plan,
)
from testbed.cli.progress import Reporter
from testbed.common.choices import OnFailure, TraceChoice
from testbed.experiments.inputs import load_inputs
from testbed.policy import parse_options
from testbed.report.results import new_run_dir
from testbed.report.table import run_summary
from testbed.run.spec import RunSpec
from testbed.sim.jitter import Jitter
from testbed.sim.profile import load_profile, write_profile

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
@scenario_options
@checkpoint_option
@profile_option
@jitter_option
@target_loss_option
@loss_model_option
@trace_option
@force_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Results directory (default: a new one under runs/).")
@run_verbosity_option
def simulate(topology: Path, policy: str, policy_opts: tuple[str, ...], plan_path: Path | None,
             bubble: str | None, bubble_opts: tuple[str, ...], profile_path: Path | None,
             out: Path | None, force: bool, jitter: Jitter | None, target_loss: float | None,
             loss_model: str,
             trace: TraceChoice, on_failure: OnFailure, checkpoint_every: int | None,
             reporter: Reporter, **kwargs: Any) -> None:
    """Simulate the plan at any scale: modeled compute, flow-level network.

    Compute times come from FLOPs and the GPU type's sustained rate (or --profile);
    transfers share links max-min fairly (or one at a time where the plan arbitrates),
    each TCP connection limited by its window and slow start. Writes the same
    results.json, spans.json and trace.json.gz as `testbed up` (backend simulate, compute
    modeled). With --plan FILE, runs that plan (saved, hand-edited, or torch's CSV form).
    """
    inputs = load_inputs(topology, **job_flags(kwargs))
    spec = RunSpec("simulate", inputs.topology, inputs.job, policy,
                   dict(parse_options(policy_opts)), bubble_policy=bubble,
                   bubble_options=dict(parse_options(bubble_opts)),
                   profile=load_profile(profile_path) if profile_path else None,
                   events=inputs.events,
                   jitter=jitter.with_seed(inputs.job.seed) if jitter else None,
                   target_loss=target_loss, trace=trace, scenario=inputs.scenario,
                   on_failure=on_failure, checkpoint_every=checkpoint_every or 0,
                   loss_model=loss_model)
    spec = with_plan(spec, plan_path)
    check(spec)
    directory = results_dir(out, force, lambda: new_run_dir(inputs.topology.name, spec.policy))
    outcome = run(spec, directory, reporter.say)
    for line in run_summary(outcome.results):
        click.echo(line)
    click.echo(f"simulated in {outcome.typed.wall_s or 0:.2f} s; results in {directory}")
    if outcome.error is not None:  # a scenario's failure that stopped the run
        click.echo(f"testbed: error: {outcome.error}", err=True)
        sys.exit(outcome.error.exit_code)


@click.command()
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the profile (default: RUN_DIR/profile.json).")
def profile(run_dir: Path, output: Path | None) -> None:
    """Measure per-stage forward/backward times from a run, for `simulate --profile`, and
    how much compute and prefill times varied, for `simulate --jitter`."""
    stages, spread = write_profile(run_dir, output)
    for stage, times in stages.items():
        click.echo(f"stage {stage}: forward {times.get('forward_s', 0) * 1e3:.3f} ms, "
                   f"backward {times.get('backward_s', 0) * 1e3:.3f} ms")
    measured = {k: v for k, v in spread.items() if v is not None}
    if measured:
        jitter = ",".join(f"{k}={v:.1%}" for k, v in measured.items())
        click.echo(f"measured spread (CV): {', '.join(f'{k} {v:.1%}' for k, v in measured.items())}"
                   f"; to simulate it: --jitter {jitter}")
    click.echo(f"profile written to {output or run_dir / 'profile.json'}")
