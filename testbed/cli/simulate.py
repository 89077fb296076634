"""`testbed simulate` and `testbed profile`: the same plans at paper scale."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from testbed.api import check, run, spec_for
from testbed.cli.options import (
    event_options,
    force_option,
    job_flags,
    job_options,
    results_dir,
    run_verbosity_option,
    scenario_option,
)
from testbed.cli.progress import Reporter
from testbed.cli.spec_options import given_settings, spec_options
from testbed.experiments.inputs import load_inputs
from testbed.report.profile import write_profile
from testbed.report.results import new_run_dir
from testbed.report.table import run_summary


@click.command()
@click.argument("topology", metavar="TOPOLOGY.yaml",
                type=click.Path(dir_okay=False, path_type=Path))
@spec_options("simulate")
@job_options
@event_options
@scenario_option
@force_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Results directory (default: a new one under runs/).")
@run_verbosity_option
def simulate(topology: Path, out: Path | None, force: bool, reporter: Reporter,
             **kwargs: Any) -> None:
    """Simulate the plan at any scale: modeled compute, flow-level network.

    Compute times come from FLOPs and the GPU type's sustained rate (or --profile);
    transfers share links max-min fairly (or one at a time where the plan arbitrates),
    each TCP connection limited by its window and slow start. Writes the same
    results.json, spans.json and trace.json.gz as `testbed up` (backend simulate, compute
    modeled). With --plan FILE, runs that plan (saved, hand-edited, or torch's CSV form).
    """
    settings = given_settings("simulate", kwargs)
    inputs = load_inputs(topology, **job_flags(kwargs))
    spec = spec_for("simulate", inputs, settings)
    check(spec)
    directory = results_dir(out, force, lambda: new_run_dir(inputs.topology.name, spec.policy))
    outcome = run(spec, directory, reporter.say)
    for line in run_summary(outcome.typed):
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
