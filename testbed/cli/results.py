"""`testbed results ...`: saved results checked against the schema testbed ships."""

from __future__ import annotations

import json
from pathlib import Path

import click

from testbed.common.jsonio import read_json
from testbed.common.units import plural
from testbed.errors import EXIT_INPUT, InputError, one_line, printable
from testbed.report.results_schema import LAUNCH_KIND, results_problems, shipped_schema
from testbed.report.run_results import SCHEMA_VERSION

RESULTS_FILE = "results.json"
SHOWN_PROBLEMS = 20
"""Problems `validate` prints: a file from another program can have thousands."""


@click.group()
def results() -> None:
    """Saved results and their JSON Schema."""


@results.command()
@click.argument("paths", nargs=-1, required=True, metavar="RUN_DIR_OR_FILE...",
                type=click.Path(path_type=Path))
def validate(paths: tuple[Path, ...]) -> None:
    """Check results.json files against the shipped schema (`testbed results schema`).

    A directory is searched for every results.json under it (a run's, a comparison's or
    a figures' directory). A launch's results (`testbed launch`, `"kind": "launch"`) are
    checked against the launch schema (`testbed results schema --kind launch`). Exit code
    0 when all are valid; 2 when any is not, with one line per problem naming the file,
    the key (a JSON path) and the problem (the first 20; then how many more).
    """
    problems: list[InputError] = []
    for path in paths:
        try:
            found = _results_files(path)
        except InputError as exc:
            problems.append(exc)
            continue
        before = len(problems)
        for file in found:
            try:
                problems += results_problems(read_json(file), str(file))
            except InputError as exc:  # not JSON, unreadable
                problems.append(exc)
        if len(problems) == before:
            click.echo(printable(f"{path}: ok: {len(found)} results.json, "
                                 f"schema_version {SCHEMA_VERSION}"))
    for problem in problems[:SHOWN_PROBLEMS]:
        click.echo(f"testbed: error: {one_line(str(problem))}", err=True)
    if len(problems) > SHOWN_PROBLEMS:
        click.echo(f"testbed: error: {plural(len(problems) - SHOWN_PROBLEMS, 'more problem')} "
                   f"not shown ({len(problems)} in all)", err=True)
    if problems:
        raise click.exceptions.Exit(EXIT_INPUT)


@results.command()
@click.option("--kind", type=click.Choice(["run", LAUNCH_KIND]), default="run",
              show_default=True, help="A run's results.json (`up`, `simulate`), or a "
              "launch's (`testbed launch`, its `kind` is launch).")
def schema(kind: str) -> None:
    """Print results.json's JSON Schema (draft 2020-12), as installed with testbed."""
    click.echo(json.dumps(shipped_schema(kind), indent=2))


def _results_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.exists():
        raise InputError("no such file or directory", str(path))
    found = sorted(path.rglob(RESULTS_FILE))
    if not found:
        raise InputError(f"no {RESULTS_FILE} in this directory or under it", str(path))
    return found
