"""`testbed compare` and `testbed report`: policies side by side, honest about noise."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from testbed.api import refuse_the_other_backends, spec_for
from testbed.cli.options import (
    event_options,
    force_option,
    format_option,
    job_flags,
    job_options,
    results_dir,
    scenario_option,
    verbosity_option,
)
from testbed.cli.progress import Reporter
from testbed.cli.spec_options import given_settings, spec_options
from testbed.common.choices import BackendName, FigureFormat, values_of
from testbed.common.fsutil import write_atomic
from testbed.common.units import plural
from testbed.experiments.comparison import (
    CompareConfig,
    GivenRun,
    check_repeat,
    comparison_runs,
    run_comparison,
    write_compare,
)
from testbed.experiments.inputs import load_inputs
from testbed.plan.load import given_plan
from testbed.policy.registry import DEFAULT_COMPARISON
from testbed.report.compare import RunEntry, markdown_table, table_rows, table_text
from testbed.report.results import new_run_dir
from testbed.report.saved import SavedRun, load_compare, load_spans
from testbed.topology import load_topology
from testbed.topology.model import Topology


@click.command()
@click.argument("topology", metavar="TOPOLOGY.yaml",
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("-p", "--policy", "policies", multiple=True, default=DEFAULT_COMPARISON,
              show_default=True, help="Training policy; repeat to compare several. The first "
              "is the baseline for speed-ups. Default: the default policy against Atlas. "
              "POLICY:LABEL is a variant of POLICY in a row of its own, with options of "
              "its own (-o POLICY:LABEL.KEY=VALUE).")
@click.option("--plan", "plan_paths", multiple=True, metavar="FILE",
              type=click.Path(dir_okay=False, path_type=Path),
              help="A plan to run beside the policies, its row named by the file: a plan's "
              "CSV (`testbed plan --csv`, saved or edited by hand) or torch's CSV form of a "
              "pipeline schedule, validated and dry-run first, run with the hooks of the "
              "policy it records (or plan-file). Repeatable; without -p only the plans are "
              "compared.")
@click.option("-b", "--bubble", "bubbles", multiple=True,
              help="Bubble policy; repeat for several. Every policy runs with each.")
@click.option("-o", "--option", "policy_opts", multiple=True, metavar="[POLICY.]KEY=VALUE",
              help="Policy option, for one policy (atlas.connections=8), one labelled "
              "variant (diloco:h10.inner_steps=10) or all; the most specific wins.")
@click.option("--backend", type=click.Choice(values_of(BackendName)), default="simulate",
              show_default=True, help="emulate: real workers over the emulated WAN (root).")
@click.option("--repeat", type=int, default=1, show_default=True,
              help="Runs per combination; the table shows the median and the spread.")
@spec_options("compare")
@job_options
@event_options
@scenario_option
@force_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the comparison (default: a new one under runs/).")
@format_option
@verbosity_option
def compare(topology: Path, policies: tuple[str, ...], plan_paths: tuple[Path, ...],
            bubbles: tuple[str, ...], policy_opts: tuple[str, ...], backend: BackendName,
            repeat: int, out: Path | None, force: bool, fmt: FigureFormat,
            reporter: Reporter, **kwargs: Any) -> None:
    """Run policies on the same topology, job and seed, one after another, and compare.

    Prints a table (iteration time with its spread over repeats, speed-up against the
    first policy as a ratio of tokens/s, tokens/s, the time to --target-loss, GPU and WAN
    utilization, TTFT when bubbles are filled) and writes compare.json, compare.csv, every
    run's own directory, and plots (throughput.png, gantt.png, wan.png, and loss.png: loss
    against time, where the runs measured a loss). A run that fails is reported as
    failed, with why under the table; the others still run. `testbed report DIR` redraws
    all of it from the files.
    """
    check_repeat(repeat)
    if backend == "emulate":
        from testbed.cli.net import require_root

        require_root()
    settings = given_settings("compare", kwargs)
    refuse_the_other_backends(backend, settings)
    jitter = settings.get("jitter")
    flags = job_flags(kwargs)
    inputs = load_inputs(topology, **flags)
    if plan_paths and click.get_current_context().get_parameter_source(
            "policies") is not ParameterSource.COMMANDLINE:
        policies = ()  # the plans alone, unless policies are named beside them
    plans = [GivenRun(str(path), *given_plan(path, inputs.topology, inputs.job))
             for path in plan_paths]
    base = spec_for(backend, inputs, settings)
    runs = comparison_runs(base, policies, bubbles, policy_opts, repeat, plans)
    directory = results_dir(out, force, lambda: new_run_dir(inputs.topology.name, "compare"))
    with reporter.counting(f"{backend}: {plural(len(runs), 'run')}", len(runs), "run") as steps:
        done = run_comparison(runs, directory, steps.start, steps.finish, reporter.detail)
    entries = [entry for entry, _ in done]
    common = base.common
    config: CompareConfig = {"topology": str(topology), "backend": backend,
              "policies": list(policies), "plans": [str(p) for p in plan_paths],
              "bubbles": list(bubbles), "repeat": repeat,
              "options": list(policy_opts), "job_overrides": _overrides(flags),
              "jitter": jitter.as_dict() if jitter is not None else None,
              "target_loss": common.target_loss, "loss_model": common.loss_model,
              "scenario": inputs.scenario.source, "on_failure": common.on_failure}
    write_compare(directory, config, entries)
    if jitter:
        share = "its congestion control's" if jitter.share is None else f"{jitter.share:.1%}"
        click.echo(f"jitter (CV): compute {jitter.compute:.0%}, prefill {jitter.prefill:.0%}, "
                   f"network {jitter.network:.0%}, share {share}; seeds "
                   f"{inputs.job.seed}..{inputs.job.seed + repeat - 1}")
    show(directory, entries, inputs.topology, fmt=fmt)


def _overrides(kwargs: dict[str, Any]) -> dict[str, Any]:  # click's parsed options
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in kwargs.items()
            if v not in (None, ())}


def show(directory: Path, entries: list[RunEntry], topology: Topology,
         plots: bool = True, fmt: FigureFormat = "png") -> None:
    """Print the table and draw every plot from the runs' files, each in `fmt` with its
    CSV beside it: throughput (and time to loss) per combination, and the Gantt chart,
    WAN use and loss of each combination's first run."""
    from testbed.report.plots import Throughput, throughput_plot
    from testbed.report.run_plots import draw_runs

    rows = table_rows(entries)
    firsts: dict[str, RunEntry] = {}
    for entry in entries:
        if entry.status == "ok" and entry.results is not None:
            firsts.setdefault(entry.combo, entry)
    runs = [SavedRun(combo, entry.results or {}, *load_spans(directory, entry))
            for combo, entry in firsts.items()]
    click.echo(table_text(rows))
    write_atomic(directory / "table.md", markdown_table(rows) + "\n", 0o644)
    if not plots:
        click.echo(f"wrote table.md in {directory}")
        return
    target = next((row.to_loss.target for row in rows if row.to_loss), None)
    points = []
    for row in rows:
        rates = [rate for e in entries if e.combo == row.combo and e.status == "ok"
                 and (f := e.figures) is not None and (rate := f.tokens_per_s)]
        loss = row.to_loss
        points.append(Throughput(
            row.combo, row.tokens_per_s, min(rates, default=None), max(rates, default=None),
            row.speedup, loss.time_s if loss else None, loss.cell(" ") if loss else None,
            (loss.fastest_s, loss.slowest_s) if loss else (None, None),
            bool(loss and loss.basis == "predicted")))
    throughput_plot(points, directory / f"throughput.{fmt}", target)
    draw_runs(runs, topology, directory, fmt, target)
    click.echo(f"wrote compare.json, compare.csv, table.md and plots in {directory}")


@click.command()
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("--plots/--no-plots", default=True, show_default=True,
              help="Draw the plots again (the table alone is instant).")
@format_option
def report(directory: Path, plots: bool, fmt: FigureFormat) -> None:
    """Rebuild a comparison's table and plots from its saved results, without rerunning."""
    _, entries = load_compare(directory)
    topology = load_topology(directory / "topology.yaml")
    show(directory, entries, topology, plots, fmt)
