"""`testbed up`: real workers training over the emulated WAN."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from testbed.api import check, run, spec_for
from testbed.cli.net import machine_option, require_root, this_machine
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
from testbed.emulator.resume import load_resumption
from testbed.errors import InputError
from testbed.experiments.inputs import load_inputs
from testbed.report.results import new_run_dir
from testbed.report.run_dirs import claim
from testbed.report.table import run_summary
from testbed.run.checkpoint import Progress
from testbed.topology import Topology
from testbed.topology.seats import ClusterRun
from testbed.topology.secret_file import read_secret


def echo_err(message: str) -> None:
    click.echo(message, err=True)


@click.command()
@click.argument(
    "topology", metavar="TOPOLOGY.yaml", required=False,
    type=click.Path(dir_okay=False, path_type=Path)
)
@spec_options("up")
@job_options
@event_options
@scenario_option
@force_option
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Results directory (default: a new one under runs/).",
)
@click.option(
    "--resume",
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    metavar="RUN_DIR",
    help="Go on with a run started with --checkpoint-every from its newest complete "
    "checkpoint, with its own topology, job and options (give no others); results are "
    "written back into RUN_DIR.",
)
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Run across the machines of this cluster file, coordinated from this "
              "machine (its coordinator): brings up this machine's share of the network, "
              "starts its torchrun and prints the command for each other machine.")
@machine_option
@click.option("--join-timeout", type=click.FloatRange(min=1), default=300.0,
              show_default=True, help="Seconds the other machines get to join (--cluster).")
@run_verbosity_option
def up(topology: Path | None, out: Path | None, force: bool, resume: Path | None,
       cluster_file: Path | None, machine: str | None, join_timeout: float,
       reporter: Reporter, **kwargs: Any) -> None:
    """Train over the emulated WAN: one worker process per GPU in its namespace.

    Brings the network up, starts the workers, runs the policy's plan (or the one
    --plan FILE gives) for the job's iterations, prints progress per iteration, and tears
    everything down. Writes results.json, trace.json.gz (open in ui.perfetto.dev), plan.csv,
    topology.yaml and worker logs into the results directory, also when the run fails or
    is interrupted.

    With --cluster, run it on the cluster's coordinator, then start on every other
    machine the torchrun command it prints (each brings up its own share of the network).
    Results stay on this machine.
    """
    require_root()
    progress: Progress | None = None
    if resume is not None:
        refuse_with_resume(topology)
        claim(resume, "--resume")  # taken over before anything is read: one resumer at a time
        spec, progress = load_resumption(resume)
        directory = resume
        echo_err(f"resuming {resume} after iteration {progress.completed} of "
                 f"{spec.job.iterations}")
    else:
        if topology is None:
            raise click.UsageError("give TOPOLOGY.yaml, or --resume RUN_DIR")
        settings = given_settings("up", kwargs)
        inputs = load_inputs(topology, **job_flags(kwargs))
        cluster = cluster_run(cluster_file, machine, join_timeout, inputs.topology)
        spec = spec_for("emulate", inputs, {**settings, "cluster": cluster})
        check(spec)
        directory = results_dir(out, force,
                                lambda: new_run_dir(inputs.topology.name, spec.policy))
    outcome = run(spec, directory, reporter.say, progress)
    for line in run_summary(outcome.typed):
        click.echo(line)
    click.echo(f"results in {directory}")
    if outcome.error is not None:
        click.echo(f"testbed: error: {outcome.error}", err=True)
        sys.exit(outcome.error.exit_code)


def cluster_run(path: Path | None, machine: str | None, join_timeout: float,
                topology: Topology) -> ClusterRun | None:
    """--cluster's run, from this machine (which must be the coordinator)."""
    cluster, machine = this_machine(path, machine, topology)
    if cluster is None or machine is None:
        return None
    if machine != cluster.coordinator:
        raise InputError(f"this is machine {machine}; a run starts on the coordinator, "
                         f"{cluster.coordinator}", str(path), "coordinator")
    return ClusterRun(cluster, machine, read_secret(cluster), join_timeout)


def refuse_with_resume(topology: Path | None) -> None:
    """A resumed run is the run it was: nothing given on this command line may change it
    (how much it shows of its progress, --quiet or --verbose, may)."""
    context = click.get_current_context()
    given = [name for name in context.params if name not in ("resume", "reporter")
             and context.get_parameter_source(name) is ParameterSource.COMMANDLINE]
    if topology is not None or given:
        what = "TOPOLOGY.yaml" if topology is not None else f"--{given[0].replace('_', '-')}"
        raise InputError(f"takes the run's own topology, job and options; {what} cannot be "
                         "given with it", "--resume")
