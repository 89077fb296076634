"""Results directories a command has created, recorded while it runs, so that `testbed
down` can remove those a killed command left empty.

A command creates its results directory before it plans (to hold it against another
process from the start), and removes it again, still empty, when it ends early
(testbed.report.run_dirs). A command killed outright (SIGKILL) cannot: the directory
stays, empty. So each command that created one keeps a record of it under the state
folder, named by its identity (testbed.common.owners), and removes the record as it
ends. `testbed down` takes the records of processes that are gone and removes the
directories they name that are still empty (an empty directory only: one that holds
anything is a run's results, and stays), then the records. Where the state folder cannot
be written (not root), nothing is recorded and nothing of it is left for `down`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path

from testbed.common import owners
from testbed.common.fsutil import write_atomic

FOLDER = "made"
"""Under the state folder: one record per live command that created directories."""


def _records() -> Path:
    return owners.STATE_DIR / FOLDER


def record(paths: Sequence[Path]) -> None:
    """This process has created `paths` (all of them so far; it replaces the last record)."""
    with contextlib.suppress(OSError):
        _records().mkdir(parents=True, exist_ok=True, mode=0o700)
        write_atomic(_records() / owners.identity(),
                     json.dumps([str(p.absolute()) for p in paths]))


def forget() -> None:
    """This process is done with what it created (it removed what it left empty)."""
    with contextlib.suppress(OSError):
        (_records() / owners.identity()).unlink()


def remove_left() -> list[Path]:
    """The directories recorded by processes that are gone and still empty, removed (with
    their records); what they recorded that holds files stays."""
    removed: list[Path] = []
    folder = _records()
    if not folder.is_dir():
        return removed
    for entry in sorted(folder.iterdir()):
        if entry.name.startswith(".") or not owners.gone(entry.name):
            continue  # a live command's, or not a record
        try:
            paths = json.loads(entry.read_text())
        except (OSError, ValueError):
            paths = []
        for name in paths if isinstance(paths, list) else []:
            path = Path(str(name))
            try:  # rmdir itself refuses a directory that holds anything, or a link
                path.rmdir()
            except OSError:
                continue
            removed.append(path)
        with contextlib.suppress(OSError):
            entry.unlink()
    return removed
