"""`testbed compare` and `testbed report`: policies side by side, honest about noise."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from testbed.api import run
from testbed.choices import ActivationsChoice, BackendName, ComputeChoice
from testbed.cli_options import (
    emulation_options,
    event_options,
    force_option,
    jitter_option,
    job_flags,
    job_options,
    parse_dilation,
    results_dir,
    target_loss_option,
)
from testbed.errors import InputError, TestbedError, did_you_mean
from testbed.fsutil import write_atomic
from testbed.inputs import load_inputs
from testbed.plan.load import given_plan
from testbed.plan.model import Plan
from testbed.policy.registry import DEFAULT_COMPARISON, check_policies, given_plan_policy
from testbed.report.compare import RunEntry, csv_text, markdown_table, table_rows, table_text
from testbed.report.results import new_run_dir, strict_json
from testbed.report.saved import load_compare, load_spans
from testbed.run_dirs import one_name
from testbed.run_spec import RunSpec
from testbed.sim.jitter import Jitter
from testbed.sim.planning import shared_cache
from testbed.topology import dump_topology, load_topology
from testbed.topology.model import Topology
from testbed.units import plural
from testbed.yamlio import to_yaml

COMPARE_SCHEMA = 1


def _options_for(name: str, pairs: tuple[str, ...], unprefixed: bool = True) -> dict[str, str]:
    """`-o atlas.connections=8` goes to atlas only; `-o connections=8` to every training
    policy; bubble policies take only options prefixed with their name."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InputError(f"expected [POLICY.]KEY=VALUE, got {pair!r}", "--option")
        owner, dot, option = key.partition(".")
        if dot and owner == name:
            out[option] = value
        elif not dot and unprefixed:
            out[key] = value
    return out


def _check_owners(pairs: tuple[str, ...], chosen: tuple[str, ...]) -> None:
    """`-o gpip.connections=2`: an option for a policy that is not in the comparison."""
    for pair in pairs:
        owner, dot, _ = pair.partition("=")[0].partition(".")
        if dot and owner not in chosen:
            raise InputError(f"{pair!r} is for {owner!r}, which is not compared here"
                             f"{did_you_mean(owner, chosen)}", "--option")


@click.command()
@click.argument("topology", metavar="TOPOLOGY.yaml",
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("-p", "--policy", "policies", multiple=True, default=DEFAULT_COMPARISON,
              show_default=True, help="Training policy; repeat to compare several. The first "
              "is the baseline for speed-ups. Default: the default policy against Atlas.")
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
              help="Policy option, for one policy (atlas.connections=8) or all.")
@click.option("--backend", type=click.Choice(["emulate", "simulate"]), default="simulate",
              show_default=True, help="emulate: real workers over the emulated WAN (root).")
@click.option("--repeat", type=int, default=1, show_default=True,
              help="Runs per combination; the table shows the median and the spread.")
@click.option("--compute", type=click.Choice(["auto", "real", "emulated"]), default="auto",
              show_default=True, help="Compute mode for the emulate backend.")
@job_options
@event_options
@emulation_options
@jitter_option
@target_loss_option
@force_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the comparison (default: a new one under runs/).")
def compare(topology: Path, policies: tuple[str, ...], plan_paths: tuple[Path, ...],
            bubbles: tuple[str, ...], policy_opts: tuple[str, ...], backend: BackendName,
            repeat: int,
            compute: ComputeChoice, out: Path | None, pacing: str,
            activations: ActivationsChoice, dilation: str, jitter: Jitter | None,
            target_loss: float | None, force: bool, **kwargs: Any) -> None:
    """Run policies on the same topology, job and seed, one after another, and compare.

    Prints a table (iteration time with its spread over repeats, speed-up against the
    first policy as a ratio of tokens/s, tokens/s, the time to --target-loss, GPU and WAN
    utilization, TTFT when bubbles are filled) and writes compare.json, compare.csv, every
    run's own directory, and plots (iterations.png, gantt.png, wan.png, and loss.png: loss
    against time, where the runs measured a loss). A run that fails is reported as
    failed, with why under the table; the others still run. `testbed report DIR` redraws
    all of it from the files.
    """
    if repeat < 1:
        raise InputError("must be at least 1", "--repeat")
    if backend == "emulate":
        from testbed.cli_net import require_root

        require_root()
    factor = parse_dilation(dilation)
    if backend == "simulate" and factor != 1:
        raise InputError("applies to --backend emulate only (the simulator has no clock "
                         "to slow down)", "--dilation")
    if backend == "emulate" and jitter:
        raise InputError("applies to --backend simulate only (an emulated run has its own "
                         "noise)", "--jitter")
    inputs = load_inputs(topology, **job_flags(kwargs))
    if plan_paths and click.get_current_context().get_parameter_source(
            "policies") is not ParameterSource.COMMANDLINE:
        policies = ()  # the plans alone, unless policies are named beside them
    _check_owners(policy_opts, policies + bubbles)
    check_policies([(p, _options_for(p, policy_opts)) for p in policies],
                   [(b, _options_for(b, policy_opts, False)) for b in bubbles])
    runs: list[tuple[str, Plan | None, str | None]] = [(p, None, None) for p in policies]
    runs += [(str(path), *given_plan(path, inputs.topology, inputs.job)) for path in plan_paths]
    directory = results_dir(out, force, lambda: new_run_dir(inputs.topology.name, "compare"))
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / "topology.yaml", to_yaml(dump_topology(inputs.topology)), 0o644)
    combos = [(r, b) for r in runs for b in (bubbles or (None,))]
    entries: list[RunEntry] = []
    total = len(combos) * repeat
    with shared_cache(), click.progressbar(  # ablations reuse their parent's simulations
            length=total, label=f"{backend}: {plural(total, 'run')}", file=sys.stderr,
            item_show_func=lambda x: x) as bar:
        for (label, plan, plan_file), bubble in combos:
            policy = label if plan is None else given_plan_policy(plan, None)
            for k in range(repeat):
                name = f"{one_name(label)}{'+' + bubble if bubble else ''}-r{k + 1}"
                bar.update(0, name)
                spec = RunSpec(backend, inputs.topology, inputs.job, policy,
                               _options_for(policy, policy_opts) if plan is None else {},
                               plan=plan, plan_file=plan_file, bubble_policy=bubble,
                               bubble_options=_options_for(bubble or "", policy_opts, False)
                               if bubble else None, compute=compute,
                               events=inputs.events, pacing=pacing == "on",
                               activations=activations, dilation=factor,
                               # every combination meets the same noise in its k-th repeat
                               jitter=jitter.with_seed(inputs.job.seed + k) if jitter else None,
                               target_loss=target_loss)
                entries.append(_run_one(spec, directory, name, k, label))
                bar.update(1, name)
    config = {"schema": COMPARE_SCHEMA, "topology": str(topology), "backend": backend,
              "policies": list(policies), "plans": [str(p) for p in plan_paths],
              "bubbles": list(bubbles), "repeat": repeat,
              "options": list(policy_opts), "job_overrides": _overrides(kwargs),
              "jitter": jitter.as_dict() if jitter else None, "target_loss": target_loss}
    write_compare(directory, config, entries)
    if jitter:
        click.echo(f"jitter (CV): compute {jitter.compute:.0%}, prefill {jitter.prefill:.0%}, "
                   f"network {jitter.network:.0%}; seeds {inputs.job.seed}.."
                   f"{inputs.job.seed + repeat - 1}")
    show(directory, entries, inputs.topology)


def _overrides(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in kwargs.items()
            if v not in (None, ())}


def _run_one(spec: RunSpec, directory: Path, name: str, repeat: int, label: str) -> RunEntry:
    """`label`: the row's name: the policy, or a given plan's file."""
    run_dir = directory / "runs" / name
    try:
        outcome = run(spec, run_dir)
    except TestbedError as exc:
        return RunEntry(label, spec.bubble_policy, repeat, str(run_dir.relative_to(
            directory)), "failed", str(exc), None)
    results = outcome.results
    return RunEntry(label, spec.bubble_policy, repeat,
                    str(run_dir.relative_to(directory)), results["status"],
                    results.get("error"), results)



def write_compare(directory: Path, config: dict[str, Any], entries: list[RunEntry]) -> None:
    """compare.json: the settings, each combination's row as the table shows it (speed-up,
    time to loss), and every run with its results; compare.csv: one line per run."""
    rows = [asdict(row) for row in table_rows(entries)]
    write_atomic(directory / "compare.json", strict_json(
        {**config, "rows": rows, "runs": [e.as_dict() for e in entries]}, indent=1,
        default=str), 0o644)
    write_atomic(directory / "compare.csv", csv_text(entries), 0o644)


def show(directory: Path, entries: list[RunEntry], topology: Topology,
         plots: bool = True) -> None:
    """Print the table and draw every plot from the runs' files."""
    from testbed.report.plots import gantt_plot, iteration_plot, loss_plot, wan_plot

    rows = table_rows(entries)
    firsts: dict[str, RunEntry] = {}
    for entry in entries:
        if entry.status == "ok" and entry.results is not None:
            firsts.setdefault(entry.combo, entry)
    spans = {combo: load_spans(directory, entry) for combo, entry in firsts.items()}
    click.echo(table_text(rows))
    write_atomic(directory / "table.md", markdown_table(rows) + "\n", 0o644)
    if not plots:
        click.echo(f"wrote table.md in {directory}")
        return
    iteration_plot(rows, directory / "iterations.png")
    panels, wan = [], []
    capacity: dict[str, float] = {}
    for link in topology.links:
        capacity[f"{link.a}>{link.b}"] = capacity[f"{link.b}>{link.a}"] = link.bandwidth_bps
    for combo, entry in firsts.items():
        start, run_spans = spans[combo]
        done = len(entry.results["iteration_time_s"]["all"]) if entry.results else 0
        iteration = 1 if done > 1 else 0
        panels.append((combo, run_spans, start, iteration))
        wan.append((combo, run_spans, start, capacity))
    if panels:
        gantt_plot(panels, directory / "gantt.png")
        wan_plot(wan, directory / "wan.png")
    curves = [(combo, entry.results["loss_curve"]) for combo, entry in firsts.items()
              if entry.results and entry.results.get("loss_curve")]
    if curves:
        target = next((row.to_loss.target for row in rows if row.to_loss), None)
        loss_plot(curves, directory / "loss.png", target)
    click.echo(f"wrote compare.json, compare.csv, table.md and plots in {directory}")


@click.command()
@click.argument("directory", metavar="DIR", type=click.Path(file_okay=False, path_type=Path))
@click.option("--plots/--no-plots", default=True, show_default=True,
              help="Draw the plots again (the table alone is instant).")
def report(directory: Path, plots: bool) -> None:
    """Rebuild a comparison's table and plots from its saved results, without rerunning."""
    _, entries = load_compare(directory)
    topology = load_topology(directory / "topology.yaml")
    show(directory, entries, topology, plots)
