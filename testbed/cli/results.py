"""`testbed results ...`: saved results checked against the schema testbed ships."""

from __future__ import annotations

import json
from pathlib import Path

import click

from testbed.errors import InputError
from testbed.report.results_schema import check_results, shipped_schema
from testbed.report.run_results import SCHEMA_VERSION
from testbed.report.saved import read_json

RESULTS_FILE = "results.json"


@click.group()
def results() -> None:
    """Saved results and their JSON Schema."""


@results.command()
@click.argument("paths", nargs=-1, required=True, metavar="RUN_DIR_OR_FILE...",
                type=click.Path(path_type=Path))
def validate(paths: tuple[Path, ...]) -> None:
    """Check results.json files against the shipped schema (`testbed results schema`).

    A directory is searched for every results.json under it (a run's, a comparison's or
    a figures' directory). Exit code 0 when all are valid; 2 with one line naming the
    file, key and problem at the first that is not.
    """
    for path in paths:
        found = _results_files(path)
        for file in found:
            check_results(read_json(file), str(file))
        click.echo(f"{path}: ok: {len(found)} results.json, schema_version {SCHEMA_VERSION}")


@results.command()
def schema() -> None:
    """Print results.json's JSON Schema (draft 2020-12), as installed with testbed."""
    click.echo(json.dumps(shipped_schema(), indent=2))


def _results_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    if not path.exists():
        raise InputError("no such file or directory", str(path))
    found = sorted(path.rglob(RESULTS_FILE))
    if not found:
        raise InputError(f"no {RESULTS_FILE} in this directory or under it", str(path))
    return found
