"""The `testbed` command. Errors become one line on stderr with a fixed exit code."""

from __future__ import annotations

import errno
import json
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any, Literal, TypedDict

import click

from testbed import DISTRIBUTION, __version__, api
from testbed.cli import finished, loaded
from testbed.cli.compare import compare, report
from testbed.cli.figures import figures
from testbed.cli.launch import launch
from testbed.cli.net import down, net
from testbed.cli.options import (
    job_flags,
    job_options,
    policy_option,
    policy_options,
    topology_argument,
)
from testbed.cli.results import results
from testbed.cli.show import show
from testbed.cli.simulate import profile, simulate
from testbed.cli.sweep import sweep
from testbed.cli.up import up
from testbed.common import sigint
from testbed.common.fsutil import write_named
from testbed.common.units import human_duration, human_rate, plural
from testbed.errors import EXIT_INPUT, Terminated, TestbedError, TestbedWarning, one_line
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import keeping_answers, shared_cache
from testbed.plan import plan_grid, plan_to_csv, validate_plan
from testbed.plan.describe import describe_plan
from testbed.plan.host_limits import this_machine
from testbed.plan.load import load_plan
from testbed.policy import discover, parse_options
from testbed.policy.option_parsers import option_text
from testbed.policy.registry import BUBBLE_GROUP, TRAINING_GROUP
from testbed.report.run_dirs import released

EPILOG = """\b
Examples:
  testbed validate topologies/paper-3dc.yaml
  testbed plan topologies/two-dc.yaml -p 1f1b
  testbed plugins
  testbed net up topologies/two-dc.yaml --detach
  testbed net exec east-0 -- ping -c 3 west-1
  testbed down
"""


DEBUG_VARIABLE = "TESTBED_DEBUG"
_debug: list[bool] = []
"""Whether this command was given --debug (or TESTBED_DEBUG=1), for main()."""


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="testbed")
@click.option("--debug", is_flag=True, envvar=DEBUG_VARIABLE,
              help=f"On an error, print the whole traceback (with its causes, a plugin's "
              f"included) before the one-line message. Also {DEBUG_VARIABLE}=1.")
def cli(debug: bool) -> None:
    """Geo-distributed LLM training on one machine.

    Describe datacenters and the WAN between them in a topology file, pick a scheduling
    policy, and see how training behaves: as a plan, over an emulated WAN with real
    processes, or in a simulator at paper scale.
    """
    _debug.append(debug)


@cli.command()
@topology_argument
@job_options
def validate(topology: Path, **kwargs: Any) -> None:
    """Check a topology file (and its job) and summarize it.

    Exit code 0 when valid; 2 with one line naming the file, key and problem otherwise.
    """
    inputs = load_inputs(topology, **job_flags(kwargs))
    topo, job = inputs.topology, inputs.job
    click.echo(
        f"{topo.source}: ok: topology {topo.name!r}, "
        f"{plural(len(topo.datacenters), 'datacenter')}, {plural(topo.total_gpus, 'GPU')}, "
        f"{plural(len(topo.links), 'WAN link')}"
    )
    for dc in topo.datacenters:
        click.echo(
            f"  {dc.name}: {dc.gpus} x {dc.gpu.name}, {human_rate(dc.bandwidth_bps)} "
            f"host links, {human_duration(dc.latency_s)} inside"
        )
    for link in topo.links:
        extra = ""
        if link.jitter_s:
            extra += f", jitter {human_duration(link.jitter_s)}"
        if link.loss:
            extra += f", loss {link.loss:.2%}"
        click.echo(
            f"  {link.a} <-> {link.b}: {human_duration(link.latency_s)} one way, "
            f"{human_rate(link.bandwidth_bps)}{extra}"
        )
    m = job.model
    click.echo(
        f"  job: model {plural(m.layers, 'layer')} x {m.hidden} hidden, {m.mlp} MLP, "
        f"{'tied' if m.tied_embeddings else 'untied'} embeddings, seq {m.seq_len}, "
        f"{m.params / 1e6:.1f}M parameters; microbatch {job.microbatch_size}, "
        f"{plural(job.iterations, 'iteration')}, seed {job.seed}"
    )
    click.echo(f"  data: {job.data.path} ({job.data.format}, {job.data.tokens:,} tokens)"
               if job.data else "  data: synthetic (seeded)")
    if job.inference is not None:
        inf = job.inference
        load = "trace" if inf.trace else f"{inf.arrival_rate:g} requests/s"  # a rate
        click.echo(
            f"  inference: {load}, prompts {inf.prompt.distribution} "
            f"(mean {inf.prompt.mean:.0f} tokens)"
        )


@cli.command()
@topology_argument
@policy_option
@policy_options
@job_options
@click.option(
    "--comm/--no-comm",
    default=False,
    help="Show send/receive actions in the grid, not only compute.",
)
@click.option(
    "--rows",
    type=int,
    default=60,
    show_default=True,
    help="At most this many grid rows (0 for all).",
)
@click.option(
    "--csv",
    "csv_out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also write the plan as CSV to this file.",
)
@click.option(
    "--load",
    "csv_in",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Validate and show a plan CSV (a saved plan, or torch's CSV form of a pipeline "
    "schedule: one row of actions per rank) instead of asking the policy.",
)
def plan(
    topology: Path,
    policy: str,
    policy_opts: tuple[str, ...],
    comm: bool,
    rows: int,
    csv_out: Path | None,
    csv_in: Path | None,
    **kwargs: Any,
) -> None:
    """Show the plan a policy makes: placement, per-GPU actions and a summary.

    The grid has one column per GPU (replica r, its stages s) and one row per step;
    `2F0` is stage 2 forward of microbatch 0, `1B3` a backward (`1I3`, `1W3` its input
    and weight halves), `ALLREDUCE` and `STEP` end an iteration. Every plan is dry-run
    first: deadlocks and unmatched transfers are errors.
    """
    inputs = load_inputs(topology, **job_flags(kwargs))
    if csv_in is not None:
        the_plan = load_plan(csv_in, inputs.topology, inputs.job)
    else:
        the_plan = api.plan(inputs, policy, parse_options(policy_opts))
        validate_plan(the_plan, inputs.topology, this_machine())
    click.echo(plan_grid(the_plan, communication=comm, max_rows=rows or None))
    click.echo()
    for line in describe_plan(the_plan, inputs.topology, inputs.job):
        click.echo(line)
    if csv_out is not None:
        write_named(csv_out, plan_to_csv(the_plan), "--csv")
        click.echo(f"plan written to {csv_out}")


class OptionRow(TypedDict):
    default: object
    help: str


class PluginRow(TypedDict):
    """A plugin as `testbed plugins` lists it (`--json`: one object each)."""

    kind: Literal["training", "bubble", "loss"]
    name: str
    distribution: str
    target: str
    status: str
    """`ok`, or `broken: WHY`."""
    summary: str
    options: dict[str, OptionRow]
    fixed: dict[str, object]
    """The settings the policy fixes (its own keyword arguments' values)."""


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plugins(as_json: bool) -> None:
    """List installed policy plugins, where they come from, and their options.

    Training policies register under the entry-point group `testbed.policies`, bubble
    policies under `testbed.bubbles`. A plugin that fails to load, or is written for
    another policy API version, is listed as broken with the reason. Loss models
    (`--loss-model`) register under `testbed.loss_models`; they are listed without being
    imported (one is imported when a run asks for it).
    """
    from importlib.metadata import entry_points

    from testbed.policy.loss_models import DEFAULT_LOSS_MODEL, LOSS_GROUP

    rows: list[PluginRow] = []
    groups: tuple[tuple[str, Literal["training", "bubble"]], ...] = (
        (TRAINING_GROUP, "training"), (BUBBLE_GROUP, "bubble"))
    for group, kind in groups:
        for name, info in discover(group).items():
            rows.append(
                {
                    "kind": kind,
                    "name": name,
                    "distribution": info.distribution,
                    "target": info.target,
                    "status": "ok" if info.ok else f"broken: {info.error}",
                    "summary": info.summary,
                    "options": {o.name: {"default": o.default, "help": o.help}
                                for o in info.options},
                    "fixed": dict(info.fixed),
                }
            )
    rows.append({"kind": "loss", "name": DEFAULT_LOSS_MODEL, "distribution": DISTRIBUTION,
                 "target": "testbed.loss.published:PublishedModel", "status": "ok",
                 "summary": "the built-in loss model: every coefficient from a published "
                 "source (docs/loss-model.md)", "options": {}, "fixed": {}})
    for entry in sorted(entry_points(group=LOSS_GROUP), key=lambda e: e.name):
        rows.append({"kind": "loss", "name": entry.name,
                     "distribution": entry.dist.name if entry.dist else "unknown",
                     "target": entry.value, "status": "ok",
                     "summary": f"a loss model ({entry.value}), imported when asked for",
                     "options": {}, "fixed": {}})
    if as_json:
        click.echo(json.dumps(rows, indent=2, default=str))
        return
    name_w = max((len(r["name"]) for r in rows), default=0)
    dist_w = max((len(r["distribution"]) for r in rows), default=0)
    settings = [f"{k}={option_text(v)}" for r in rows for k, v in
                [*((k, o["default"]) for k, o in r["options"].items()), *r["fixed"].items()]]
    setting_w = max((len(t) for t in settings), default=0)
    for row in rows:
        click.echo(
            f"{row['kind']:<9} {row['name']:<{name_w}}  {row['distribution']:<{dist_w}}  "
            f"{row['status'] if row['status'] != 'ok' else row['summary']}"
        )
        for opt, spec in row["options"].items():
            setting = f"{opt}={option_text(spec['default'])}"
            click.echo(f"{'':<10}-o {setting:<{setting_w}}  {spec['help']}")
        for key, value in row["fixed"].items():
            setting = f"{key}={option_text(value)}"
            click.echo(f"{'':<10}   {setting:<{setting_w}}  fixed by this policy")


cli.add_command(net)
cli.add_command(down)
cli.add_command(up)
cli.add_command(launch)
cli.add_command(simulate)
cli.add_command(profile)
cli.add_command(sweep)
cli.add_command(compare)
cli.add_command(report)
cli.add_command(show)
cli.add_command(figures)
cli.add_command(results)


def _one_line_warnings() -> None:
    """testbed's own warnings as `testbed: warning: ...` (no source line); others as
    Python shows them."""
    shown = warnings.showwarning
    if getattr(shown, "testbed", False):
        return

    def show(message: Warning | str, category: type[Warning], *args: Any,
             **kwargs: Any) -> None:
        if issubclass(category, TestbedWarning):
            click.echo(f"testbed: warning: {one_line(str(message))}", err=True)
        else:
            shown(message, category, *args, **kwargs)
    show.testbed = True  # type: ignore[attr-defined]
    warnings.showwarning = show


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turning known failures into one line and an exit code."""
    loaded()
    try:
        _run(argv)
        if sigint.arrived():  # raised where Python could only print it (testbed.common.sigint)
            click.echo("testbed: interrupted", err=True)
            sys.exit(130)
    finally:
        finished()


def _run(argv: list[str] | None) -> None:
    _debug.clear()
    _one_line_warnings()
    try:
        # plans of one command share simulations (compare, sweep), and searches read back
        # what the same search answered before; it holds its directories
        with shared_cache(), keeping_answers(), released():
            code = cli.main(args=argv, prog_name="testbed", standalone_mode=False)
    except click.exceptions.Abort as exc:
        _traceback(exc)
        click.echo("testbed: interrupted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(EXIT_INPUT if isinstance(exc, click.UsageError) else exc.exit_code)
    except TestbedError as exc:
        _traceback(exc)
        click.echo(f"testbed: error: {one_line(str(exc))}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt as exc:
        _traceback(exc)
        click.echo("testbed: interrupted", err=True)
        sys.exit(130)
    except Terminated as exc:
        _traceback(exc)
        click.echo("testbed: terminated", err=True)
        sys.exit(143)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        _traceback(exc)
        where = f" writing {exc.filename}" if exc.filename else ""
        click.echo(f"testbed: error: no space left on the device{where}", err=True)
        sys.exit(1)
    if isinstance(code, int) and code:
        sys.exit(code)


def _traceback(exc: BaseException) -> None:
    """With --debug (or TESTBED_DEBUG=1), the whole traceback of an error, causes first."""
    if any(_debug):
        traceback.print_exception(exc, file=sys.stderr)
