"""A sweep's directory: what it is (sweep.json), the points done so far (points.jsonl, a
line per point, appended and synced as each finishes) and, at the end, sweep.csv.

A sweep interrupted (Ctrl-C, killed, a dead worker) keeps the points it finished; the
same sweep run again into the same directory goes on with them, and its sweep.csv is the
one an uninterrupted sweep writes (rows always come from the saved lines, in grid
order). A directory that holds another sweep is refused unless --force, which starts
over. A saved line is taken only as this sweep wrote it: it carries a digest of the
sweep's settings and of itself, its rows are its point's runs (knobs, policy, bubble
policy, repeat) with finite figures; any other line is said and its point runs again.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from testbed.common.codec import JsonObject
from testbed.common.fsutil import write_atomic
from testbed.common.input_files import MIB, read_bounded
from testbed.common.jsonio import MAX_JSON_BYTES, loads
from testbed.common.units import plural
from testbed.errors import InputError
from testbed.experiments.sweep import (
    BUBBLE_METRICS,
    METRICS,
    Point,
    PointRun,
    Row,
    SweepDescription,
)

SWEEP_FILE = "sweep.json"
POINTS_FILE = "points.jsonl"
CSV_FILE = "sweep.csv"
SCHEMA = 1
MAX_POINTS_BYTES = 256 * MIB
"""points.jsonl: a row is a few hundred bytes, and a sweep has at most 100,000 runs."""
SHOWN_NOTES = 5
FIGURES = frozenset((*METRICS, *BUBBLE_METRICS))


def holds_sweep(directory: Path) -> bool:
    return (directory / SWEEP_FILE).is_file()


@dataclass(frozen=True)
class Sweep:
    """A sweep's directory, marked as this sweep's: the points it already held (`done`)
    and why any saved line was not taken (`notes`, one line each)."""

    directory: Path
    fingerprint: str
    done: dict[int, list[Row]]
    notes: tuple[str, ...] = ()

    def record(self, point: Point, rows: list[Row]) -> None:
        """Append the point's rows, on disk before this returns."""
        line = _line(point, rows, self.fingerprint)
        fd = os.open(self.directory / POINTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT
                     | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def rows(self, points: Sequence[Point]) -> list[Row]:
        """Every saved row, in grid order."""
        done, _ = _points(self.directory / POINTS_FILE, points, self.fingerprint)
        return [row for index in sorted(done) for row in done[index]]


def start(directory: Path, settings: SweepDescription, points: Sequence[Point],
          force: bool) -> Sweep:
    """Mark `directory` as this sweep's, with the rows of the points it already holds of
    this same sweep (none when new or `force`)."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    fingerprint = digest.hexdigest()
    done: dict[int, list[Row]] = {}
    notes: list[str] = []
    saved_points = directory / POINTS_FILE
    if holds_sweep(directory) and not force:
        saved = _saved(directory)
        if saved.get("fingerprint") != fingerprint:
            kept = saved.get("settings")
            old: JsonObject = kept if isinstance(kept, dict) else {}  # as read: unchecked
            given: Mapping[str, object] = settings
            differ = [k for k in given if old.get(k) != given[k]] or ["settings"]
            raise InputError(f"{directory} holds another sweep (its {', '.join(differ)} "
                             "differ); give a new --out, or --force to start over", "--out")
        done, notes = _points(saved_points, points, fingerprint)
        # only whole lines go on: the next point must not follow half a line a kill left
        write_atomic(saved_points, "".join(
            _line(points[index], found, fingerprint) for index, found in sorted(done.items())),
            0o644)
    else:
        try:
            saved_points.unlink(missing_ok=True)
        except OSError as exc:
            raise InputError(f"cannot remove it: {exc.strerror}", str(saved_points)) from None
    write_atomic(directory / SWEEP_FILE, json.dumps(
        {"schema": SCHEMA, "fingerprint": fingerprint, "points": len(points),
         "settings": settings}, indent=1, default=str) + "\n", 0o644)
    if len(notes) > SHOWN_NOTES:
        notes[SHOWN_NOTES:] = [f"{POINTS_FILE}: {plural(len(notes) - SHOWN_NOTES, 'more line')} "
                               "not taken, their points run again"]
    return Sweep(directory, fingerprint, done, tuple(notes))


class PointBody(TypedDict):
    """A line of points.jsonl but its digest: a point's index, knob values and rows."""

    index: int
    values: list[list[str]]
    rows: list[Row]


def _line(point: Point, rows: list[Row], fingerprint: str) -> str:
    body: PointBody = {"index": point.index, "values": [list(v) for v in point.values],
                       "rows": rows}
    return json.dumps({**body, "digest": _digest(fingerprint, body)}) + "\n"


def _digest(fingerprint: str, body: Mapping[str, object]) -> str:
    """A line's own digest, keyed by the sweep's: written by this sweep (a PointBody), and
    as written (a line as read, its keys not yet checked)."""
    text = json.dumps(body, sort_keys=True, allow_nan=True)
    return hashlib.sha256(f"{fingerprint}\n{text}".encode()).hexdigest()


def write_csv(directory: Path, columns: Sequence[str], table: Sequence[Row]) -> Path:
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=list(columns), extrasaction="ignore",
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if v is None else v) for k, v in row.items()} for row in table)
    write_atomic(directory / CSV_FILE, out.getvalue(), 0o644)
    return directory / CSV_FILE


def _saved(directory: Path) -> JsonObject:
    """sweep.json as read: raw, only its schema checked (its settings are compared)."""
    try:
        saved = loads(read_bounded(directory / SWEEP_FILE, MAX_JSON_BYTES, follow=False))
    except ValueError:  # not JSON, or nested past what any file of ours is
        saved = None
    if not isinstance(saved, dict) or saved.get("schema") != SCHEMA:
        raise InputError(f"{directory / SWEEP_FILE} is not a sweep this testbed wrote; give "
                         "a new --out, or --force to start over", "--out")
    return saved


def _points(path: Path, points: Sequence[Point], fingerprint: str
            ) -> tuple[dict[int, list[Row]], list[str]]:
    """The saved points that are this sweep's, and a note for each line that is not (a
    line cut short by a kill, the last, is left out without one)."""
    done: dict[int, list[Row]] = {}
    notes: list[str] = []
    lines = _read_lines(path)
    for number, line in enumerate(lines, start=1):
        try:
            item = loads(line)
        except ValueError:  # not JSON, or nested past what any line of ours is
            if number < len(lines):
                notes.append(f"{POINTS_FILE} line {number}: not JSON; not taken")
            continue
        index, problem = _check_line(item, points, fingerprint)
        if problem is None and index is not None:
            done[index] = item["rows"]
        elif problem is not None:
            which = f"point {index + 1} " if index is not None else ""
            again = ", it runs again" if index is not None else ""
            notes.append(f"{POINTS_FILE} line {number}: {which}{problem}: not taken{again}")
    return done, notes


def _read_lines(path: Path) -> list[str]:
    """points.jsonl's lines: a regular file of ours (never a link, nor a FIFO that would
    block or a device that never ends), bounded in size; none when there is none."""
    if not os.path.lexists(path):
        return []
    try:
        data = read_bounded(path, MAX_POINTS_BYTES, follow=False)
    except InputError as exc:
        raise InputError(f"{exc.problem}: not one this testbed wrote; give a new --out, or "
                         "--force to start over", str(path)) from None
    return data.decode("utf-8", errors="replace").splitlines()


def _check_line(item: Any, points: Sequence[Point], fingerprint: str
                ) -> tuple[int | None, str | None]:
    """(the point a saved line is of, why it is not taken or None)."""
    if not isinstance(item, dict):
        return None, "not a point's line"
    index = item.get("index")
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(points):
        return None, "names no point of this sweep"
    body = {key: item.get(key) for key in ("index", "values", "rows")}
    if item.get("digest") != _digest(fingerprint, body):
        return index, "not written by this sweep, or changed since"
    point = points[index]
    if body["values"] != [list(v) for v in point.values]:
        return index, "its knobs' values are another point's"
    rows = body["rows"]
    if not isinstance(rows, list) or len(rows) != len(point.runs):
        return index, f"not one row for each of its {plural(len(point.runs), 'run')}"
    for row, run in zip(rows, point.runs, strict=True):
        problem = _row_problem(row, point, run)
        if problem is not None:
            return index, problem
    return index, None


def _row_problem(row: Any, point: Point, run: PointRun) -> str | None:
    """Why a saved row is not the run's, or None."""
    if not isinstance(row, dict):
        return "a row that is not a mapping"
    expected = {**dict(point.values), **run.labels}
    for key, value in expected.items():
        if row.get(key) != value:
            return f"a row of {key} {row.get(key)!r} where the point runs {value!r}"
    for key, value in row.items():
        if key in expected:
            continue
        if key == "error":
            if not isinstance(value, str):
                return "a row whose error is not text"
        elif key not in FIGURES:
            return f"a row with {key!r}, which a sweep's rows do not have"
        elif value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                    or not math.isfinite(value)):
            return f"a row whose {key} is {value!r}, not a finite number"
    return None
