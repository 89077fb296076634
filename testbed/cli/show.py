"""`testbed show`: one past run again, its summary and its plots, from its files."""

from __future__ import annotations

from pathlib import Path

import click

from testbed.cli.options import format_option
from testbed.common.choices import FigureFormat
from testbed.errors import InputError
from testbed.report.launch_results import launch_summary
from testbed.report.saved import load_run
from testbed.report.table import run_summary
from testbed.topology import load_topology


@click.command()
@click.argument("run_dir", metavar="RUN_DIR", type=click.Path(path_type=Path))
@click.option("--out", type=click.Path(path_type=Path),
              help="Directory for the plots (default: RUN_DIR).")
@format_option
def show(run_dir: Path, out: Path | None, fmt: FigureFormat) -> None:
    """Print a run's summary and draw its plots, from its directory.

    RUN_DIR is a directory `testbed up` or `testbed simulate` wrote (a comparison's runs
    are in its runs/ folder), or `testbed launch` (its ranks' outcomes and WAN use, and
    wan.png and loss.png drawn again). Prints the summary those commands print at the end, with the
    scenario entries and network events the run was given, and draws gantt.png (one
    iteration per GPU), wan.png (each WAN link direction's use over the run) and, where
    the run measured its loss, loss.png, each with a CSV of its numbers beside it.
    """
    from testbed.report.run_plots import draw_runs  # matplotlib: only when drawing

    if _is_launch(run_dir):
        from testbed.emulator.runtime.launch.outcome import redraw

        directory = out or run_dir
        directory.mkdir(parents=True, exist_ok=True)
        results = redraw(run_dir, directory, fmt)
        for line in launch_summary(results):
            click.echo(line)
        click.echo(f"wrote wan.{fmt}{f', loss.{fmt}' if results.loss_curve else ''} in "
                   f"{directory}")
        return
    run = load_run(run_dir)
    topology = load_topology(run_dir / "topology.yaml")
    directory = out or run_dir
    if directory.exists() and not directory.is_dir():
        raise InputError("exists and is not a directory", str(directory), "--out")
    directory.mkdir(parents=True, exist_ok=True)
    if run.typed is None:
        click.echo(f"{run.source}: written before testbed's results had a schema: "
                   "no summary")
    for line in run_summary(run.typed) if run.typed else []:
        click.echo(line)
    target = (run.results.get("time_to_loss") or {}).get("target")
    written = draw_runs([run], topology, directory, fmt, target)
    click.echo(f"wrote {', '.join(path.name for path in written)} in {directory}")


def _is_launch(run_dir: Path) -> bool:
    """Whether RUN_DIR holds a launch's results (`"kind": "launch"`)."""
    import json

    try:
        return bool(json.loads((run_dir / "results.json").read_text()).get("kind") ==
                    "launch")
    except (OSError, ValueError, AttributeError):
        return False
