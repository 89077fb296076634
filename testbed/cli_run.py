"""`testbed up`: real workers training over the emulated WAN."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from testbed.cli_net import SHAPERS, require_root
from testbed.cli_options import job_flags, job_options, load_inputs, policy_options
from testbed.policy import parse_options, training_policy
from testbed.policy.registry import make_plan
from testbed.report.results import RunRecord, new_run_dir, write_run
from testbed.report.table import run_summary


def echo_err(message: str) -> None:
    click.echo(message, err=True)


@click.command()
@click.argument(
    "topology", metavar="TOPOLOGY.yaml", type=click.Path(dir_okay=False, path_type=Path)
)
@click.option(
    "-p",
    "--policy",
    default="1f1b",
    show_default=True,
    help="Training policy (see `testbed plugins`).",
)
@policy_options
@job_options
@click.option(
    "--compute",
    type=click.Choice(["auto", "real", "emulated"]),
    default="auto",
    show_default=True,
    help="real: torch forward/backward; emulated: each GPU is held busy for the "
    "modeled time while real-size tensors cross the network. auto: real when "
    "there is a GPU per worker.",
)
@click.option(
    "--shaper",
    type=click.Choice(SHAPERS),
    default="auto",
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
    type=click.Choice(["auto", "real"]),
    default="auto",
    show_default=True,
    help="auto: with emulated compute, gradient all-reduces inside one DC are modeled at the "
    "DC's bandwidth (this machine cannot push intra-DC rates through Python); all-reduces "
    "across the WAN always move real bytes. real: always move real bytes.",
)
@click.option(
    "--stall-timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds without progress before the run is declared hung.",
)
def up(
    topology: Path,
    policy: str,
    policy_opts: tuple[str, ...],
    compute: str,
    shaper: str,
    out: Path | None,
    allreduce: str,
    stall_timeout: float,
    **kwargs: Any,
) -> None:
    """Train over the emulated WAN: one worker process per GPU in its namespace.

    Brings the network up, starts the workers, runs the policy's plan for the job's
    iterations, prints progress per iteration, and tears everything down. Writes
    results.json, trace.json (open in ui.perfetto.dev), plan.csv, topology.yaml and
    worker logs into the results directory, also when the run fails or is interrupted.
    """
    from testbed.runtime.coordinator import (
        Coordinator,
        Interrupted,
        RunFailed,
        choose_compute,
        run_with_signals,
    )
    from testbed.runtime.worker import run_loop

    require_root()
    inputs = load_inputs(topology, **job_flags(kwargs))
    options = dict(parse_options(policy_opts))
    chosen = training_policy(policy, options)
    plan = make_plan(chosen, inputs.topology, inputs.job)
    workers = len(plan.used_gpus())
    mode = choose_compute(compute, workers)
    directory = out or new_run_dir(inputs.topology.name, policy)
    coordinator = Coordinator(
        inputs.topology,
        inputs.job,
        plan,
        chosen,
        mode,
        directory / "logs",
        shaper,
        stall_timeout,
        echo_err,
        allreduce=allreduce,
    )
    started = time.monotonic()
    error: Exception | None = None
    try:
        run_loop(run_with_signals(coordinator))
    except (RunFailed, Interrupted) as exc:
        error = exc
    outcome = coordinator.outcome
    if outcome is None:
        if error is not None:
            raise error
        return
    record = RunRecord(
        backend="emulate",
        policy=policy,
        bubble_policy=None,
        topology=inputs.topology,
        job=inputs.job,
        plan=plan,
        shaper=outcome.shaper,
        compute=mode,
        summary=outcome.summary,
        spans=outcome.spans,
        start=outcome.start,
        status=outcome.status,
        error=outcome.error,
        losses=outcome.losses,
        extra={"allreduce": allreduce},
        policy_options=options,
        wall_s=time.monotonic() - started,
    )
    path = write_run(directory, record)
    for line in run_summary(record.results()):
        click.echo(line)
    click.echo(f"results in {path.parent}")
    if error is not None:
        click.echo(f"testbed: error: {error}", err=True)
        sys.exit(getattr(error, "exit_code", 1))
