"""`testbed figures`: the paper's claims, each measured at conditions sourced in its
topology's comments, as claims.json, a table and a PNG per claim."""

from __future__ import annotations

import contextlib
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path

import click

from testbed.cli.options import format_option, verbosity_option
from testbed.cli.progress import Reporter
from testbed.common.choices import FigureFormat, values_of
from testbed.common.fsutil import write_atomic
from testbed.common.progress import Counting, Steps
from testbed.errors import InputError, printable
from testbed.experiments.inputs import load_inputs
from testbed.figures.claims import BACKENDS, Backend, Conditions, claims
from testbed.figures.collect import (
    ClaimRecord,
    measure,
    records,
    summarize_conditions,
    with_frontiers,
)
from testbed.figures.frontier import (
    SPACES,
    SearchName,
    Space,
    default_workers,
    search_all,
    shape,
)
from testbed.figures.load_curve import load_curve
from testbed.figures.measure import Say
from testbed.figures.render import (
    MARKERS,
    claims_table,
    details_markdown,
    has_markers,
    load_records,
    update_markdown,
    write_records,
)
from testbed.report.results import new_run_dir
from testbed.topology import load_topology

SHIPPED = Path(__file__).resolve().parents[2] / "topologies"
DEFAULT_CONDITIONS = ("wan-3dc.yaml", "paper-3dc.yaml")
"""Cloud inter-region links with Linux's TCP defaults, and leased 1 Gbit/s circuits (the
contrast where one flow already fills most of a link); their comments give the sources."""


@click.command()
@click.option("--backend", type=click.Choice([*values_of(Backend), "both"]),
              default="simulate", show_default=True,
              help="Which column to measure; emulate runs real workers over the emulated "
              "WAN (root; time-dilated where links exceed this machine) and takes far longer.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Directory for claims.json, figures.md, the PNGs and every run (default: "
              "a new one under runs/). One that holds claims.json keeps the other backend's "
              "column.")
@click.option("--conditions", "topologies", multiple=True,
              type=click.Path(dir_okay=False, path_type=Path),
              help="Topology files to measure at (repeatable; default: the shipped "
              "wan-3dc.yaml and paper-3dc.yaml).")
@click.option("--claims", "only", metavar="ID,...",
              help="Only these claims (ids as in claims.json, before the colon).")
@click.option("--readme", type=click.Path(dir_okay=False, path_type=Path), metavar="FILE.md",
              help="Rewrite the Paper claims table, and what bounds each claim, between "
              "the markers <!-- paper-claims:begin --> and <!-- paper-claims:end --> of "
              "this Markdown file (the documentation's page is docs/claims.md).")
@click.option("--emulate-budget", "budget_min", type=click.FloatRange(min=0, min_open=True),
              default=20.0, show_default=True, metavar="MINUTES",
              help="Skip (and say so) an emulated run the simulator predicts would take "
              "longer than this at its dilation.")
@click.option("--frontier", "search", type=click.Choice(values_of(SearchName)),
              default="coarse", show_default=True,
              help="With the simulator: search each claim's design space (WAN latency and "
              "bandwidth, TCP buffers, model, DCs, request rate) for where its figure is "
              "largest: claims.json's up_to, a heat map per claim. On 2 cores the whole "
              "command takes about 12 minutes with coarse, 45 with full (a dense grid), "
              "4 with off.")
@click.option("--time-to-loss", "loss_grid", type=click.Choice(values_of(SearchName)),
              default="off", show_default=True,
              help="With the simulator: Atlas against DiLoCo and Streaming DiLoCo by predicted "
              "time to loss over the search's WAN latency x bandwidth grid (coarse or full): "
              "time-to-loss.png, the winner of each cell and its margin (coarse: about 10 "
              "minutes on 2 cores on paper-3dc).")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Processes the search simulates points in  [default: the cores]")
@format_option
@verbosity_option
def figures(backend: str, out: Path | None, topologies: tuple[Path, ...], only: str | None,
            readme: Path | None, budget_min: float, search: SearchName,
            loss_grid: SearchName, workers: int | None, fmt: FigureFormat,
            reporter: Reporter) -> None:
    """Reproduce each of the paper's claims: multiple connections, PP against DP across
    DCs, temporal sharing, Atlas against GPipe, 1F1B and DP across DCs, weak scaling with
    DCs, DC selection, the bubbles Atlas leaves, BubbleTea's utilization and slowdown.

    Every claim is measured at each set of conditions (a topology whose comments source
    its values), against the paper's figure, with what bounds it; a claim that does not
    reproduce says so in its row. With the simulator, each claim is also searched for in
    a sourced design space (--frontier: how far it goes, and where) and BubbleTea gets
    its load curve. `--backend simulate` takes about 12 minutes on 2 cores (4 with
    --frontier off); the emulated column is filled by a later `--backend emulate --out
    SAME_DIR`.
    """
    from testbed.figures.charts import claim_plot  # matplotlib: only this command draws

    backends: list[Backend] = list(BACKENDS) if backend == "both" else [backend]  # type: ignore[list-item]
    if "emulate" in backends:
        from testbed.cli.net import require_root

        require_root()
    conditions = [_conditions(path) for path in _condition_files(topologies)]
    wanted = _wanted(only, conditions)
    if readme is not None and (not readme.is_file() or not has_markers(readme)):
        raise InputError(f"{readme} is not a file with the {MARKERS} markers the table "
                         "goes between", "--readme")
    directory, saved = _directory(out)

    def say(message: str) -> None:
        reporter.say(_stamped(message))

    def count(title: str, total: int, unit: str) -> AbstractContextManager[Steps]:
        return reporter.counting(_stamped(title), total, unit)

    for chosen in backends:
        measured = measure(conditions, chosen, wanted, directory, say, budget_min * 60,
                           reporter.detail, count)
        saved = records(measured, chosen, saved)
        write_records(directory / "claims.json", saved)
    if "simulate" in backends:
        saved = _simulator_only(conditions, wanted, saved, search, loss_grid, workers,
                                directory, fmt, say, count)
    write_atomic(directory / "figures.md", details_markdown(saved) + "\n", 0o644)
    for record in saved:
        claim_plot(record, directory / f"{record['id'].replace(':', '-')}.{fmt}")
    if readme is not None:
        try:
            update_markdown(readme, saved)
        except ValueError as exc:
            raise InputError(str(exc), "--readme") from None
    click.echo(printable(claims_table(saved)))  # from claims.json
    click.echo(f"\nclaims.json, figures.md, a figure per claim (and its heat map and "
               f"load curves with the simulator) in {directory}", file=sys.stdout)


def _condition_files(topologies: tuple[Path, ...]) -> tuple[Path, ...]:
    """The topologies given, or the shipped ones where they are installed."""
    if not topologies and not SHIPPED.is_dir():
        raise InputError("the shipped topologies are not installed with the package (they "
                         "are in the repository's topologies/): give --conditions FILE",
                         "--conditions")
    return topologies or tuple(SHIPPED / name for name in DEFAULT_CONDITIONS)


def _directory(out: Path | None) -> tuple[Path, list[ClaimRecord]]:
    """The output directory, made, and the records an earlier run left there: --out may
    name a new or empty directory, or one an earlier `testbed figures` wrote (whose other
    backend's column is kept), nothing else."""
    directory = out or new_run_dir("claims", "figures")
    if directory.is_symlink() or (directory.exists() and not directory.is_dir()):
        raise InputError(f"{directory} is not a plain directory", "--out")
    if directory.is_dir() and any(directory.iterdir()) \
            and not (directory / "claims.json").exists():
        raise InputError(f"{directory} holds files but no claims.json: give an empty or new "
                         "directory, or one an earlier `testbed figures` wrote", "--out")
    directory.mkdir(parents=True, exist_ok=True)
    try:
        return directory, load_records(directory / "claims.json")
    except ValueError as exc:
        raise InputError(str(exc), "--out") from None


def _simulator_only(conditions: list[Conditions], wanted: set[str] | None,
                    saved: list[ClaimRecord], search: SearchName, loss_grid: SearchName,
                    workers: int | None, directory: Path, fmt: FigureFormat, say: Say,
                    count: Counting) -> list[ClaimRecord]:
    """What only the simulator is fast enough for: BubbleTea's load curves, each claim's
    design-space search, the time-to-loss maps."""
    if wanted is None or wanted & {"bubbletea_utilization", "bubbletea_slowdown"}:
        for cond in conditions:
            _load_curve(cond, directory, fmt, say)
    if search != "off":
        saved = _frontiers(conditions, wanted, saved, search, workers, directory, fmt, say,
                           count)
        write_records(directory / "claims.json", saved)
    if loss_grid != "off":
        _loss_maps(conditions, SPACES[loss_grid], workers or default_workers(), directory,
                   fmt, say, count)
    return saved


def _load_curve(cond: Conditions, directory: Path, fmt: FigureFormat, say: Say) -> None:
    """BubbleTea against the arrival rate at these conditions."""
    from testbed.figures.charts import load_plot

    inputs = load_inputs(Path(cond.topology))
    points = load_curve(cond, say)
    deadline = inputs.job.inference.deadline_s if inputs.job.inference else None
    load_plot(points, deadline, f"BubbleTea on Atlas's plan, {cond.topology}: "
              f"{cond.summary}", directory / f"load-{Path(cond.topology).stem}.{fmt}")


def _stamped(message: str) -> str:
    return f"[{time.strftime('%H:%M:%S')}] {message}"


def _frontiers(conditions: list[Conditions], wanted: set[str] | None,
               saved: list[ClaimRecord], search: SearchName, workers: int | None,
               directory: Path, fmt: FigureFormat, say: Say, count: Counting
               ) -> list[ClaimRecord]:
    """Each claim searched once per shape of conditions: its up_to in the records and a
    heat map (named after its first conditions where the shapes differ)."""
    from testbed.figures.charts import heat_map

    started = time.monotonic()
    found = search_all(conditions, wanted, SPACES[search], workers or default_workers(),
                       count)
    shapes = {tuple(f.conditions) for f in found}
    by_key = {}
    for f in found:
        suffix = "" if len(shapes) == 1 else f"-{Path(f.conditions[0]).stem}"
        claim = next((r["claim"] for r in saved if r["id"].startswith(f.claim + ":")), f.claim)
        unit = next((r["unit"] for r in saved if r["id"].startswith(f.claim + ":")), "")
        heat_map(f, claim, unit, directory / f"frontier-{f.claim}{suffix}.{fmt}")
        up_to = f.frontier.up_to(f.target, f.at_most, search)
        by_key.update({(f.claim, cond): up_to for cond in f.conditions})
    say(f"frontier: {sum(len(f.frontier.results) for f in found)} claim-points searched in "
        f"{time.monotonic() - started:.0f} s")
    return with_frontiers(saved, by_key)


def _loss_maps(conditions: list[Conditions], space: Space, workers: int, directory: Path,
               fmt: FigureFormat, say: Say, count: Counting) -> None:
    """Atlas against the DiLoCo family by time to loss, once per shape of conditions
    (their WAN is the grid's): time-to-loss.png and its CSV."""
    from testbed.figures.charts import loss_map_plot
    from testbed.figures.loss_map import loss_map, summary

    shapes: dict[str, list[Conditions]] = {}
    for cond in conditions:
        shapes.setdefault(shape(load_topology(Path(cond.topology))), []).append(cond)
    for members in shapes.values():
        topology = load_topology(Path(members[0].topology))
        cells = loss_map(topology, space.latencies_ms, space.bandwidths_gbit, workers, count)
        suffix = "" if len(shapes) == 1 else f"-{Path(members[0].topology).stem}"
        loss_map_plot(cells, ", ".join(c.topology for c in members),
                      directory / f"time-to-loss{suffix}.{fmt}")
        say(f"time to loss, {', '.join(c.topology for c in members)}: {summary(cells)}")


def _conditions(path: Path) -> Conditions:
    inputs = load_inputs(path)  # a bad file fails here, before anything runs
    shown = path
    with contextlib.suppress(ValueError):  # outside the working directory: as given
        shown = path.resolve().relative_to(Path.cwd())
    return Conditions(str(shown), summarize_conditions(inputs.topology))


def _wanted(only: str | None, conditions: list[Conditions]) -> set[str] | None:
    if only is None:
        return None
    wanted = {part.strip() for part in only.split(",") if part.strip()}
    inputs = load_inputs(Path(conditions[0].topology))
    known = {spec.id for spec in claims(inputs.topology, inputs.job, conditions[0])}
    unknown = sorted(wanted - known)
    if unknown or not wanted:
        raise InputError(f"unknown claim {', '.join(unknown) or '(none given)'} (claims: "
                         f"{', '.join(sorted(known))})", "--claims")
    return wanted
