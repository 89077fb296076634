"""`testbed up`: real workers training over the emulated WAN."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from testbed.api import check, run
from testbed.cli.net import SHAPERS, machine_option, require_root, this_machine
from testbed.cli.options import (
    bubble_options,
    emulation_options,
    event_options,
    force_option,
    job_flags,
    job_options,
    loss_model_option,
    parse_dilation,
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
from testbed.common.choices import (
    ActivationsChoice,
    AllReduceChoice,
    ComputeChoice,
    OnFailure,
    ShaperChoice,
    TraceChoice,
    values_of,
)
from testbed.errors import InputError
from testbed.experiments.inputs import load_inputs
from testbed.policy import parse_options
from testbed.report.results import new_run_dir
from testbed.report.run_dirs import claim
from testbed.report.table import run_summary
from testbed.run.checkpoint import Progress
from testbed.run.resume import load_resumption
from testbed.run.spec import RunSpec
from testbed.runtime.wire.secret import read_secret
from testbed.topology import Topology
from testbed.topology.seats import ClusterRun


def echo_err(message: str) -> None:
    click.echo(message, err=True)


@click.command()
@click.argument(
    "topology", metavar="TOPOLOGY.yaml", required=False,
    type=click.Path(dir_okay=False, path_type=Path)
)
@policy_option
@policy_options
@plan_option
@bubble_options
@job_options
@event_options
@scenario_options
@emulation_options
@target_loss_option
@loss_model_option
@trace_option
@force_option
@click.option(
    "--compute",
    type=click.Choice(values_of(ComputeChoice)),
    default=RunSpec.compute,
    show_default=True,
    help="real: torch forward/backward; emulated: each GPU is held busy for the "
    "modeled time while real-size tensors cross the network. auto: real when "
    "there is a GPU per worker.",
)
@click.option(
    "--shaper",
    type=click.Choice(SHAPERS),
    default=RunSpec.shaper,
    show_default=True,
    help="netem where the kernel has it, else the userspace delay line.",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    help="Results directory (default: a new one under runs/).",
)
@click.option(
    "--allreduce",
    type=click.Choice(values_of(AllReduceChoice)),
    default=RunSpec.allreduce,
    show_default=True,
    help="auto: with emulated compute, gradient all-reduces inside one DC are modeled at the "
    "DC's bandwidth (this machine cannot push intra-DC rates through Python); all-reduces "
    "across the WAN always move real bytes. real: always move real bytes.",
)
@click.option(
    "--stall-timeout",
    type=float,
    default=RunSpec.stall_timeout_s,
    show_default=True,
    help="Seconds in which no worker finishes an iteration before the run is declared "
    "hung (set it above an iteration's length).",
)
@click.option(
    "--checkpoint-every",
    type=click.IntRange(min=1),
    metavar="N",
    help="Checkpoint every N iterations and at the end (model and optimizer state with real "
    "compute; iteration count and measurements always) into RUN_DIR/checkpoint, so that "
    "`--resume` can go on after a crash.",
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
def up(
    topology: Path | None,
    policy: str,
    policy_opts: tuple[str, ...],
    plan_path: Path | None,
    compute: ComputeChoice,
    shaper: ShaperChoice,
    out: Path | None,
    allreduce: AllReduceChoice,
    stall_timeout: float,
    bubble: str | None,
    bubble_opts: tuple[str, ...],
    pacing: str,
    activations: ActivationsChoice,
    dilation: str,
    force: bool,
    checkpoint_every: int | None,
    resume: Path | None,
    cluster_file: Path | None,
    machine: str | None,
    join_timeout: float,
    target_loss: float | None, loss_model: str,
    trace: TraceChoice,
    on_failure: OnFailure,
    reporter: Reporter,
    **kwargs: Any,
) -> None:
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
        inputs = load_inputs(topology, **job_flags(kwargs))
        spec = RunSpec("emulate", inputs.topology, inputs.job, policy,
                       dict(parse_options(policy_opts)), bubble_policy=bubble,
                       bubble_options=dict(parse_options(bubble_opts)), compute=compute,
                       shaper=shaper, allreduce=allreduce, stall_timeout_s=stall_timeout,
                       events=inputs.events, pacing=pacing == "on", activations=activations,
                       dilation=parse_dilation(dilation), checkpoint_every=checkpoint_every or 0,
                       cluster=cluster_run(cluster_file, machine, join_timeout, inputs.topology),
                       target_loss=target_loss, trace=trace, scenario=inputs.scenario,
                       on_failure=on_failure, loss_model=loss_model)
        spec = with_plan(spec, plan_path)
        check(spec)
        directory = results_dir(out, force,
                                lambda: new_run_dir(inputs.topology.name, spec.policy))
    outcome = run(spec, directory, reporter.say, progress)
    for line in run_summary(outcome.results):
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
