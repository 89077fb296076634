"""Click options shared by several commands, and the loading they imply."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import click
from click.core import ParameterSource

from testbed.api import with_given_plan
from testbed.cli.progress import EVERY_S, Reporter
from testbed.common.choices import (
    ActivationsChoice,
    FigureFormat,
    OnFailure,
    TraceChoice,
    Verbosity,
    values_of,
)
from testbed.errors import InputError
from testbed.experiments.inputs import JOB_FLAGS
from testbed.metrics.loss import check_target_loss
from testbed.policy.loss_models import DEFAULT_LOSS_MODEL
from testbed.policy.option_parsers import option_text
from testbed.policy.registry import DEFAULT_POLICY
from testbed.report.run_dirs import claim
from testbed.run.dilation import MAX_DILATION
from testbed.run.spec import RunSpec

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
    """Pop the job-related keyword arguments a command received from `job_options`."""
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


def scenario_options(func: F) -> F:
    """--scenario FILE and --on-failure: what happens during the run (testbed.scenario.scenario)
    and what a lost worker does to it (testbed.run.recovery)."""
    func = click.option(
        "--on-failure", "on_failure", type=click.Choice(values_of(OnFailure)),
        default=RunSpec.on_failure, show_default=True,
        help="When a scenario's failure takes a worker: stop the run; restart from the "
        "last checkpoint (--checkpoint-every) on the same GPUs once the lost one is back; "
        "or replan on the GPUs still alive and go on from the last checkpoint.")(func)
    return click.option(
        "--scenario", "scenario", type=click.Path(dir_okay=False, path_type=Path),
        metavar="FILE",
        help="Scenario file (YAML): network events, link traces (CSV or generated), "
        "stragglers and failures during the run, times from the start of training "
        "(see docs/scenarios.md).")(func)


def checkpoint_option(func: F) -> F:
    """--checkpoint-every for commands whose only use of it is recovery's."""
    return click.option(
        "--checkpoint-every", "checkpoint_every", type=click.IntRange(min=1), metavar="N",
        help="Checkpoint every N iterations: where --on-failure restart or replan goes "
        "on from (without it, from the start).")(func)


def jitter_option(func: F) -> F:
    """--jitter: the simulator's seeded run-to-run noise (testbed.sim.jitter)."""
    return click.option(
        "--jitter", "jitter", metavar="CV|KIND=CV,...", callback=_parse_jitter,
        help="Simulator noise: each compute, prefill and transfer delay times a lognormal "
        "factor of mean 1 and this coefficient of variation (one value for all, or "
        "compute=10%,prefill=10%,network=5%), seeded by the job's seed (plus the repeat's "
        "number in compare). Default: none.")(func)


def _parse_jitter(_ctx: click.Context, _param: click.Parameter, value: str | None) -> Any:
    from testbed.sim.jitter import parse_jitter

    if value is None:
        return None
    try:
        return parse_jitter(value)
    except ValueError as exc:
        raise InputError(str(exc), "--jitter") from None


def target_loss_option(func: F) -> F:
    """--target-loss: report the represented time (and tokens) to reach this loss."""
    return click.option(
        "--target-loss", "target_loss", metavar="L", callback=_parse_target_loss,
        help="Report the time and tokens to loss L (time_to_loss in results.json): measured "
        "with real compute (the first step at or below L; a DiLoCo-family run's is its "
        "synchronized model's loss, evaluated at the start and after each cycle), else "
        "predicted by the loss model from the run's tokens/s; or that it was not reached. "
        "compare sorts by it.")(func)


def _parse_target_loss(_ctx: click.Context, _param: click.Parameter, value: str | None
                       ) -> float | None:
    if value is None:
        return None
    try:
        target = float(value)
    except ValueError:
        target = math.nan
    return check_target_loss(target, "--target-loss", value)


def loss_model_option(func: F) -> F:
    """--loss-model: what predicts a run's loss (testbed.policy.loss_models)."""
    return click.option(
        "--loss-model", "loss_model", metavar="NAME", default=DEFAULT_LOSS_MODEL,
        show_default=True,
        help="The loss model that predicts loss against tokens (results.json's loss_model, "
        "and the time to --target-loss where a run trains no model): the built-in one, "
        "every coefficient from a published source, or a fitted model installed under "
        "the entry-point group testbed.loss_models (see `testbed plugins`).")(func)


def trace_option(func: F) -> F:
    """--trace: how much of the run trace.json.gz draws (testbed.report.chrome)."""
    return click.option(
        "--trace", "trace", type=click.Choice(values_of(TraceChoice)), default=RunSpec.trace,
        show_default=True,
        help="trace.json.gz (Perfetto): summary draws every GPU up to 256 of them, past that "
        "one track per tensor-parallel group in as many whole replicas as fit in 256 (and "
        "says so); full draws every GPU; none writes no trace.")(func)


def bubble_options(func: F) -> F:
    """-b BUBBLE_POLICY and -B KEY=VALUE, for commands that run one combination."""
    func = click.option("-B", "--bubble-option", "bubble_opts", multiple=True,
                        metavar="KEY=VALUE", help="Bubble policy option. Repeatable.")(func)
    return click.option("-b", "--bubble", "bubble", help="Bubble policy filling training "
                        "bubbles with prefill requests from the job's inference workload "
                        "(see `testbed plugins`).")(func)


def policy_option(func: F) -> F:
    """-p: the one training policy of a command that runs one."""
    return click.option("-p", "--policy", default=DEFAULT_POLICY, show_default=True,
                        help="Training policy (see `testbed plugins`).")(func)


PLAN_HELP = (
    "Run this plan instead of asking the policy for one: a plan's CSV (`testbed plan "
    "--csv`, saved or edited by hand) or torch's CSV form of a pipeline schedule; validated "
    "and dry-run first. -p then makes no plan: it labels the run and answers the plan's "
    "hooks (who gets an arbitrated WAN link next); by default the policy the plan records, "
    "or plan-file (first come first served) when that one is not installed.")


def plan_option(func: F) -> F:
    """--plan FILE: run a given plan (see `with_plan`)."""
    return click.option("--plan", "plan_path", type=click.Path(dir_okay=False, path_type=Path),
                        metavar="FILE", help=PLAN_HELP)(func)


def with_plan(spec: RunSpec, path: Path | None) -> RunSpec:
    """`spec` running the plan in `path` (`--plan`, loaded and checked before anything
    runs), under `-p` if the command line gave one, else the plan's own policy."""
    given = click.get_current_context().get_parameter_source("policy")
    return with_given_plan(spec, path, spec.policy if given is ParameterSource.COMMANDLINE
                           else None)


def policy_options(func: F) -> F:
    func = click.option(
        "-o",
        "--option",
        "policy_opts",
        multiple=True,
        metavar="KEY=VALUE",
        help="Policy option (see `testbed plugins`). Repeatable.",
    )(func)
    return func


def parse_dilation(text: str) -> int | Literal["auto"]:
    """`--dilation`: a whole number from 1 to MAX_DILATION, or auto."""
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_DILATION:
        raise InputError(f"must be a whole number from 1 to {MAX_DILATION}, or auto "
                         f"(got {text!r})", "--dilation")
    return value


def emulation_options(func: F) -> F:
    """How the emulator represents the network: dilation, pacing, intra-DC activations."""
    func = click.option(
        "--dilation", default=str(RunSpec.dilation), show_default=True, metavar="K|auto",
        help="Run the emulation K times slower than the time it represents (link rates / K; "
        "latencies, compute, events and TCP's minimum RTO x K); every reported figure is "
        "in represented time. auto: the smallest K at which the plan's peak rate and its "
        "workers' CPU per action fit what this machine can give (both measured once, "
        "cached; see docs/training.md, Time dilation).")(func)
    func = click.option(
        "--activations", type=click.Choice(values_of(ActivationsChoice)),
        default=RunSpec.activations,
        show_default=True,
        help="auto: with emulated compute, activations between stages in one DC are "
        "modeled at the DC's bandwidth, as the simulator moves them (this machine cannot "
        "push intra-DC rates through Python); across DCs they always move real bytes. "
        "real: always move real bytes.")(func)
    return click.option(
        "--pacing", type=click.Choice(["on", "off"]), default=option_text(RunSpec.pacing),
        show_default=True,
        help="on: each cross-DC connection is paced at its share of the path's rate, as "
        "the simulator assumes (see docs/training.md, Pacing). off: unpaced bursts, to see what "
        "they cost.")(func)


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
