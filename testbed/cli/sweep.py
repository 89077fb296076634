"""`testbed sweep`: a grid of what-ifs in the simulator, its points run in parallel."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import click

from testbed import DISTRIBUTION
from testbed.cli.options import (
    event_options,
    force_option,
    job_flags,
    job_options,
    results_dir,
    verbosity_option,
)
from testbed.cli.progress import Reporter
from testbed.cli.spec_options import given_settings, spec_options
from testbed.common.units import plural
from testbed.errors import InputError, Terminated, one_line
from testbed.experiments.comparison import check_repeat
from testbed.experiments.inputs import load_inputs
from testbed.experiments.sweep import (
    Cell,
    Point,
    Row,
    SweepSettings,
    by_time_to_loss,
    columns,
    number,
    parse_vary,
    points,
    with_speedups,
)
from testbed.experiments.sweep_store import Sweep, holds_sweep, start, write_csv
from testbed.experiments.sweep_workers import LOCAL_RAY, Runner, local_workers, runner
from testbed.metrics.loss import duration_text
from testbed.policy.parallel import cores
from testbed.policy.registry import DEFAULT_POLICY, check_policies
from testbed.policy.routing import variants
from testbed.report.results import new_run_dir
from testbed.report.table import aligned

SHOWN_ROWS = 40
"""Rows printed at the end; sweep.csv has them all."""


@click.command()
@click.argument("topology", metavar="TOPOLOGY.yaml",
                type=click.Path(dir_okay=False, path_type=Path))
@click.option("-p", "--policy", "policies", multiple=True, default=(DEFAULT_POLICY,),
              show_default=True, help="Policies to compare. Repeatable; POLICY:LABEL for "
              "a variant of a policy with options of its own (as compare).")
@click.option("--vary", "varies", multiple=True, required=True, metavar="KEY=V1,V2,...",
              help="A knob and its values (KEY=V1;V2;... when values hold commas): any --set "
              "key (a job key such as microbatches or model.layers; wan.latency, "
              "wan.bandwidth, wan.A-B.KEY for one link, tcp.KEY, dc.KEY, dc.NAME.KEY, dcs "
              "for the first N datacenters), option.[POLICY.]KEY (a policy option), jitter, "
              "event (none for none). Repeatable: every combination runs.")
@click.option("-b", "--bubble", "bubbles", multiple=True,
              help="Bubble policy; repeat for several. Every policy runs with each.")
@click.option("-o", "--option", "policy_opts", multiple=True, metavar="[POLICY.]KEY=VALUE",
              help="Policy option at every point, for one policy (atlas.connections=8) or all.")
@click.option("--repeat", type=int, default=1, show_default=True,
              help="Runs per point and combination, repeat k with jitter seeded by the "
              "job's seed + k (as compare).")
@click.option("--workers", type=int, metavar="N",
              help="Points simulated at once, in local processes (default: this machine's "
              "cores; at most those, and as many as its available memory holds at 500 MB "
              "each, said when fewer); with --ray local, the CPUs of the local Ray instance.")
@click.option("--ray", "ray_address", metavar="ADDRESS|local",
              help="Run the points as tasks on a Ray cluster (its address: HOST:PORT, "
              "ray://HOST:PORT or auto; every node with testbed installed), or on a Ray "
              f"instance started here (local). Needs pip install '{DISTRIBUTION}[ray]'.")
@spec_options("sweep")
@job_options
@event_options
@force_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Directory for the sweep (default: a new one under runs/). One that holds "
              "an interrupted run of the same sweep: it goes on with the points it has.")
@verbosity_option
def sweep(topology: Path, policies: tuple[str, ...], varies: tuple[str, ...],
          bubbles: tuple[str, ...], policy_opts: tuple[str, ...], repeat: int,
          workers: int | None, ray_address: str | None, out: Path | None, force: bool,
          reporter: Reporter, **kwargs: Any) -> None:
    """What-if grid in the simulator: one CSV row per point and run, and a plot.

    Every combination of the --vary knobs is a point; each point runs every policy with
    each bubble policy, --repeat times. Points run in parallel (--workers, --ray), and
    sweep.csv is the same whatever runs them. An interrupted sweep keeps the points it
    finished: the same command with --out DIR goes on from there.

    Example: testbed sweep topologies/paper-3dc.yaml -p gpipe -p atlas
    --vary wan.latency=10ms,20ms,40ms,80ms --vary option.atlas.connections=1,4
    """
    check_repeat(repeat)
    if workers is not None and workers < 1:
        raise InputError(f"must be at least 1, got {workers}", "--workers")
    workers = cores() if workers is None else workers
    if ray_address is None or ray_address == LOCAL_RAY:  # processes on this machine
        workers, why = local_workers(workers)
        if why:
            click.echo(f"--workers: {why}", err=True)
    given = given_settings("sweep", kwargs)
    inputs = load_inputs(topology, **job_flags(kwargs))
    check_policies([(v.policy, {}) for v in variants(policies)],
                   [(name, {}) for name in bubbles])
    settings = SweepSettings(inputs, policies, tuple(parse_vary(v) for v in varies), bubbles,
                             policy_opts, repeat, **given)
    grid = points(settings)
    with runner(workers, ray_address) as run:
        resuming = out is not None and out.is_dir() and holds_sweep(out) and not force
        directory = results_dir(out, force or resuming,
                                lambda: new_run_dir(inputs.topology.name, "sweep"))
        store = start(directory, settings.describe(), grid, force)
        for note in store.notes:
            click.echo(note, err=True)
        done = store.done
        if done:
            reporter.say(f"going on with {plural(len(done), 'point')} of {len(grid)} done in "
                         f"{directory}")
        where = f"Ray ({ray_address})" if ray_address else \
            plural(min(workers, max(len(grid) - len(done), 1)), "local worker")
        _run(store, grid, run, where, reporter)
    table = with_speedups(store.rows(grid), policies, [k.key for k in settings.knobs])
    if settings.target_loss is not None:
        table = by_time_to_loss(table, [k.key for k in settings.knobs])
    csv_path = write_csv(directory, columns(settings), table)
    from testbed.report.plots import sweep_plot

    keys = [k.key for k in settings.knobs] + (["bubble"] if bubbles else [])
    sweep_plot(_medians(table, keys), keys, directory / "sweep.png")
    _show(table, keys, settings.target_loss is not None)
    click.echo(f"wrote {csv_path} and {directory / 'sweep.png'}")


def _run(sweep: Sweep, grid: list[Point], run: Runner, where: str,
         reporter: Reporter) -> None:
    done, directory = sweep.done, sweep.directory
    todo = [p for p in grid if p.index not in done]
    finished = [len(done)]
    label = f"simulating {plural(len(grid), 'point')} on {where}"
    try:
        with reporter.counting(label, len(grid), "point", len(done)) as steps:

            def store(index: int, found: list[Row]) -> None:
                sweep.record(grid[index], found)
                finished[0] += 1
                steps.finish(_named(grid[index]))

            run(todo, store)
    except (KeyboardInterrupt, Terminated):
        click.echo(f"stopped after {finished[0]} of {plural(len(grid), 'point')}; the same "
                   f"command with --out {directory} goes on from there", err=True)
        raise


def _named(point: Point) -> str:
    """A point as a progress line names it: its knobs' values."""
    return ", ".join(f"{key}={value}" for key, value in point.values) or f"point {point.index}"


def _medians(table: list[Row], keys: list[str]) -> list[Row]:
    """One row per point and combination, the median iteration over its repeats."""
    groups: dict[tuple[Cell, ...], list[Row]] = {}
    for row in table:
        groups.setdefault((row["policy"], *(row.get(k) for k in keys)), []).append(row)
    out: list[Row] = []
    for group in groups.values():
        times = [t for r in group if (t := number(r.get("iteration_s"))) is not None]
        out.append({**group[0], "iteration_s": statistics.median(times) if times else None})
    return out


def _show(table: list[Row], keys: list[str], given: bool = False) -> None:
    """The first rows as a table: what varied, the policy, the repeat, the iteration and,
    with more than one policy, the speed-up; a failed point's reason in the last column."""
    repeats = any("repeat" in row for row in table)
    speedups = len({row["policy"] for row in table}) > 1  # as sweep.csv has them
    failed = any(row.get("iteration_s") is None for row in table[:SHOWN_ROWS])
    target = next((t for row in table if (t := number(row.get("target_loss")))), None)
    header = ["policy", *keys, *(["repeat"] if repeats else []), "iteration (s)",
              *(["speed-up"] if speedups else []),
              *(["effective tokens/s", f"time to loss {target:.4g}"] if target else []),
              *(["error"] if failed else [])]
    lines = []
    for row in table[:SHOWN_ROWS]:
        iteration = number(row.get("iteration_s"))
        speedup = number(row.get("speedup"))
        lines.append([
            str(row["policy"]), *(str(row.get(k, "")) for k in keys),
            *([str(row.get("repeat", ""))] if repeats else []),
            "-" if iteration is None else f"{iteration:.3f}",
            *([("-" if speedup is None else f"{speedup:.2f}x")] if speedups else []),
            *(_to_loss_cells(row) if target else []),
            *([one_line(str(row.get("error") or "no iteration")) if iteration is None else ""]
              if failed else []),
        ])
    for line in aligned(header, lines):  # cells from points.jsonl: aligned escapes them
        click.echo(line)
    if target:
        default = "" if given else (": no --target-loss given, the default target is the loss "
                                    "every-step data parallelism reaches at the job's token "
                                    "budget")
        click.echo(f"time to loss {target:.4g} predicted by the loss model from each run's "
                   f"tokens/s (sweep.csv: time_to_loss_s, effective_tokens_per_s){default}")
    if len(table) > SHOWN_ROWS:
        click.echo(f"... {plural(len(table) - SHOWN_ROWS, 'more row')} in sweep.csv")


def _to_loss_cells(row: Row) -> list[str]:
    effective, time = number(row.get("effective_tokens_per_s")), number(row.get("time_to_loss_s"))
    return ["-" if effective is None else f"{effective:.0f}",
            "never" if time is None else duration_text(time)]
