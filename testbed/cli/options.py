"""Click options shared by several commands, and the loading they imply."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from testbed.cli.progress import EVERY_S, Reporter
from testbed.cli.spec_options import setting_option
from testbed.common.choices import (
    FigureFormat,
    Verbosity,
    values_of,
)
from testbed.errors import InputError
from testbed.experiments.inputs import JOB_FLAGS
from testbed.report.run_dirs import claim

F = TypeVar("F", bound=Callable[..., Any])



def topology_argument(func: F) -> F:
    return click.argument(
        "topology", metavar="TOPOLOGY.yaml", type=click.Path(dir_okay=False, path_type=Path)
    )(func)


def job_options(func: F) -> F:
    """--job FILE, --set KEY=VALUE and shortcuts for the values people change most."""
    options = [
        click.option(
            "--job",
            "job_file",
            type=click.Path(dir_okay=False, path_type=Path),
            help="Job file (YAML) replacing the topology's `job` section.",
        ),
        click.option(
            "--set",
            "sets",
            multiple=True,
            metavar="KEY=VALUE",
            help="Override one job or topology value, e.g. --set model.layers=8, "
            "--set wan.bandwidth=10Gbit (every WAN link), --set wan.east-west.latency=5ms, "
            "--set tcp.wmem=64MiB, --set dcs=2. Repeatable.",
        ),
        click.option("--iterations", type=int, help="Training iterations to run."),
        click.option("--microbatches", type=int, help="Microbatches per replica per iteration."),
        click.option("--dp", type=int, help="Data-parallel degree (pipeline replicas)."),
        click.option("--pp", type=int, help="Pipeline-parallel degree (stages)."),
        click.option("--seed", type=int, help="Seed for data, weights and arrivals."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def job_flags(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Pop the job-related keyword arguments a command received from `job_options`
    (click's, each its option's type)."""
    keys = ("job_file", "sets", "events", "scenario", *JOB_FLAGS)
    return {key: kwargs.pop(key) for key in keys if key in kwargs}


def event_options(func: F) -> F:
    """--event: a network event during the run, added to the topology's `events`."""
    return click.option(
        "--event",
        "events",
        multiple=True,
        metavar="at=T,link=A-B,KIND=V[,for=D]",
        help="Network event, e.g. at=30s,link=east-west,down=10s or "
        "at=60s,link=east-west,latency=80ms,for=30s (KIND: down, latency, bandwidth, "
        "loss). Repeatable.",
    )(func)


def scenario_option(func: F) -> F:
    """--scenario FILE: what happens during the run (testbed.scenario.scenario)."""
    return click.option(
        "--scenario", "scenario", type=click.Path(dir_okay=False, path_type=Path),
        metavar="FILE",
        help="Scenario file (YAML): network events, link traces (CSV or generated), "
        "stragglers and failures during the run, times from the start of training "
        "(see docs/scenarios.md).")(func)


def policy_option(func: F) -> F:
    """-p: the training policy of a command that plans (`plan`): the run's own option
    (testbed.run.spec)."""
    return setting_option("policy")(func)


def policy_options(func: F) -> F:
    """-o KEY=VALUE of a command that plans or launches, as `policy_opts`."""
    return setting_option("policy_options", dest="policy_opts")(func)


def target_loss_option(func: F) -> F:
    """--target-loss of a command that is not a run's (`launch`)."""
    return setting_option("target_loss")(func)


def force_option(func: F) -> F:
    return click.option("--force", is_flag=True,
                        help="Write into an --out directory that already holds files.")(func)


PROGRESS_HELP = (
    "Progress on stderr: on a terminal a bar; elsewhere (a log, a pipe) a status line such "
    "as `compare: 3/8 runs done, now atlas-r2, 2m10s elapsed` as each run starts and "
    f"every {EVERY_S:g} s. --quiet: none (errors, warnings and the results remain); "
    "--verbose: also each run's own lines (the emulator's, the plan search's) and a line "
    "as each run or point ends.")
RUN_PROGRESS_HELP = (
    "--quiet: errors, warnings and the results only, none of the run's progress lines "
    "(its plan search's; up's, per iteration); --verbose: those lines, as without either "
    "(a run's own lines are this command's progress).")


def verbosity_option(func: F) -> F:
    """--quiet/--verbose of a command that runs many runs or points (testbed.cli.progress)."""
    return _verbosity(PROGRESS_HELP)(func)


def run_verbosity_option(func: F) -> F:
    """--quiet/--verbose of a command of one run, whose own lines are its progress."""
    return _verbosity(RUN_PROGRESS_HELP)(func)


def _verbosity(help_text: str) -> Callable[[F], F]:
    """The option gives the command its Reporter, named after the command."""

    def reporter(ctx: click.Context, _param: click.Parameter, quiet: bool | None) -> Reporter:
        verbosity: Verbosity = "normal" if quiet is None else "quiet" if quiet else "verbose"
        return Reporter(ctx.info_name or "testbed", verbosity)

    return click.option("--quiet/--verbose", "-q/-v", "reporter", default=None,
                        callback=reporter, help=help_text)


def format_option(func: F) -> F:
    return click.option("--format", "fmt", type=click.Choice(values_of(FigureFormat)),
                        default="png", show_default=True,
                        help="File format of the plots (each has a CSV of its numbers "
                        "beside it).")(func)


def results_dir(out: Path | None, force: bool, default: Callable[[], Path]) -> Path:
    """Where a command writes, held by it until it ends (testbed.report.run_dirs): a
    fresh directory, or `--out` when it is safe to use. An `--out` that is a symbolic link
    is never followed; one that another process holds is refused; one that holds files
    (another run's results, perhaps) is refused unless `force`."""
    if out is None:
        directory = default()
        claim(directory, None, made=True)
        return directory
    if out.is_symlink():
        raise InputError(f"{out} is a symbolic link; give the directory itself", "--out")
    if out.exists() and not out.is_dir():
        raise InputError(f"{out} exists and is not a directory", "--out")
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    claim(out, "--out", made)
    if any(out.iterdir()) and not force:
        raise InputError(f"{out} already holds files (another run's results?); give an "
                         "empty or new directory, or --force to write over them", "--out")
    return out
