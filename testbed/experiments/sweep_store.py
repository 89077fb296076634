"""A sweep's directory: what it is (sweep.json), the points done so far (points.jsonl, a
line per point, appended and synced as each finishes) and, at the end, sweep.csv.

A sweep interrupted (Ctrl-C, killed, a dead worker) keeps the points it finished; the
same sweep run again into the same directory goes on with them, and its sweep.csv is the
one an uninterrupted sweep writes (rows always come from the saved lines, in grid
order). A directory that holds another sweep is refused unless --force, which starts
over.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.common.fsutil import write_atomic
from testbed.common.input_files import read_bounded
from testbed.common.jsonio import MAX_JSON_BYTES, MAX_RECORD_BYTES, loads
from testbed.errors import InputError
from testbed.experiments.sweep import Point

SWEEP_FILE = "sweep.json"
POINTS_FILE = "points.jsonl"
CSV_FILE = "sweep.csv"
SCHEMA = 1
Row = dict[str, Any]


def holds_sweep(directory: Path) -> bool:
    return (directory / SWEEP_FILE).is_file()


def start(directory: Path, settings: dict[str, Any], points: Sequence[Point],
          force: bool) -> dict[int, list[Row]]:
    """Mark `directory` as this sweep's; the rows of the points it already holds of this
    same sweep (none when new or `force`)."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    fingerprint = digest.hexdigest()
    done: dict[int, list[Row]] = {}
    if holds_sweep(directory) and not force:
        saved = _saved(directory)
        if saved.get("fingerprint") != fingerprint:
            kept = saved.get("settings")
            old: dict[str, Any] = kept if isinstance(kept, dict) else {}
            differ = [k for k in settings if old.get(k) != settings[k]] or ["settings"]
            raise InputError(f"{directory} holds another sweep (its {', '.join(differ)} "
                             "differ); give a new --out, or --force to start over", "--out")
        done = _points(directory / POINTS_FILE, points)
        # only whole lines go on: the next point must not follow half a line a kill left
        write_atomic(directory / POINTS_FILE, "".join(
            _line(points[index], found) for index, found in sorted(done.items())), 0o644)
    else:
        (directory / POINTS_FILE).unlink(missing_ok=True)
    write_atomic(directory / SWEEP_FILE, json.dumps(
        {"schema": SCHEMA, "fingerprint": fingerprint, "points": len(points),
         "settings": settings}, indent=1, default=str) + "\n", 0o644)
    return done


def record(directory: Path, point: Point, rows: list[Row]) -> None:
    """Append the point's rows, on disk before this returns."""
    line = _line(point, rows)
    fd = os.open(directory / POINTS_FILE,
                 os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def _line(point: Point, rows: list[Row]) -> str:
    return json.dumps({"index": point.index, "values": [list(v) for v in point.values],
                       "rows": rows}) + "\n"


def rows(directory: Path, points: Sequence[Point]) -> list[Row]:
    """Every saved row, in grid order."""
    done = _points(directory / POINTS_FILE, points)
    return [row for index in sorted(done) for row in done[index]]


def write_csv(directory: Path, columns: Sequence[str], table: Sequence[Row]) -> Path:
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in table)
    write_atomic(directory / CSV_FILE, out.getvalue(), 0o644)
    return directory / CSV_FILE


def _saved(directory: Path) -> dict[str, Any]:
    try:
        saved = loads(read_bounded(directory / SWEEP_FILE, MAX_JSON_BYTES, follow=False))
    except ValueError:  # not JSON, or nested past what any file of ours is
        saved = None
    if not isinstance(saved, dict) or saved.get("schema") != SCHEMA:
        raise InputError(f"{directory / SWEEP_FILE} is not a sweep this testbed wrote; give "
                         "a new --out, or --force to start over", "--out")
    return saved


def _points(path: Path, points: Sequence[Point]) -> dict[int, list[Row]]:
    """The saved points that are this sweep's (a line cut short by a kill is left out)."""
    done: dict[int, list[Row]] = {}
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return done  # not a file of ours (a link is never followed)
    except FileNotFoundError:
        return done
    for line in read_bounded(path, MAX_RECORD_BYTES, follow=False).splitlines():
        try:
            item = loads(line)
            index, values, found = item["index"], item["values"], item["rows"]
        except (ValueError, TypeError, KeyError):
            continue
        if (isinstance(index, int) and 0 <= index < len(points)
                and values == [list(v) for v in points[index].values]
                and isinstance(found, list) and len(found) == len(points[index].runs)
                and all(isinstance(r, dict) for r in found)):
            done[index] = found
    return done
