"""Reading a saved comparison (`testbed report`) or run (`testbed show`) back: every file
is checked against the shape the table and plots use before anything is drawn, so a
damaged or hand-edited file gives one located error and no half-written output."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, cast

from testbed.common.codec import JsonObject, from_json
from testbed.common.jsonio import MAX_RECORD_BYTES, read_json
from testbed.common.spans import Span, SpanRow
from testbed.errors import InputError
from testbed.report.compare import RunEntry
from testbed.report.results_schema import check_results
from testbed.report.run_results import Results

NUMBER = "number"
OPTIONAL_NUMBER = "number or null"
TEXT = "text"
OPTIONAL_TEXT = "text or null"
INTEGER = "integer"
OPTIONAL_FLAG = "true, false or null"

ENTRY = {"policy": TEXT, "bubble_policy": OPTIONAL_TEXT, "repeat": INTEGER,
         "directory": TEXT, "status": TEXT, "error": OPTIONAL_TEXT}
RESULTS = {
    "status": TEXT,
    "iteration_time_s": {"median": OPTIONAL_NUMBER, "all": [NUMBER]},
    "tokens_per_s": OPTIONAL_NUMBER,
    "gpu_utilization": {"training": OPTIONAL_NUMBER, "total": OPTIONAL_NUMBER},
    "wan": {"utilization": OPTIONAL_NUMBER},
    "inference": {"ttft_s": {"p50": OPTIONAL_NUMBER, "p99": OPTIONAL_NUMBER}},
}
LATER_RESULTS = {
    "loss_curve": [{"iteration": INTEGER, "time_s": NUMBER, "tokens": INTEGER,
                    "loss": OPTIONAL_NUMBER}],
    "time_to_loss": {"target": NUMBER, "reached": OPTIONAL_FLAG, "time_s": OPTIONAL_NUMBER,
                     "tokens": OPTIONAL_NUMBER, "reason": OPTIONAL_TEXT},
    "cycle_time_s": {"period": INTEGER},
}
"""Results keys that older runs do not have: checked where present and not null."""
ROW = {"kind": TEXT, "start": NUMBER, "end": NUMBER}
"""A row of spans.json, which names its GPU (`gpu`) or its group of GPUs (`gpus`)."""
TRANSFER = {"link": OPTIONAL_TEXT, "bytes": NUMBER}
SPANS = {"start": NUMBER, "spans": [ROW]}


def check(value: Any, shape: Any, path: str, key: str = "") -> None:
    """Raise a located InputError where `value` does not have `shape` (extra keys are
    fine: results files grow)."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            raise InputError(f"expected a mapping, got {_kind(value)}", path, key or None)
        for name, inner in shape.items():
            if name not in value:
                raise InputError("missing", path, _join(key, name))
            check(value[name], inner, path, _join(key, name))
    elif isinstance(shape, list):
        if not isinstance(value, list):
            raise InputError(f"expected a list, got {_kind(value)}", path, key or None)
        for i, item in enumerate(value):
            check(item, shape[0], path, f"{key}[{i}]")
    elif not _fits(value, shape):
        raise InputError(f"expected {shape}, got {_kind(value)}", path, key or None)


def _fits(value: Any, shape: str) -> bool:
    if value is None:
        return shape in (OPTIONAL_NUMBER, OPTIONAL_TEXT, OPTIONAL_FLAG)
    if shape == OPTIONAL_FLAG:
        return isinstance(value, bool)
    if shape in (NUMBER, OPTIONAL_NUMBER):  # an integer past a float's range is none
        return isinstance(value, int | float) and not isinstance(value, bool) \
            and abs(value) <= sys.float_info.max
    if shape == INTEGER:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, str)


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


def _kind(value: Any) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # nan, inf: not a number JSON can hold
    if isinstance(value, int) and abs(value) > sys.float_info.max:
        return f"an integer of {len(str(abs(value)))} digits"
    return "null" if value is None else type(value).__name__


def read_span_rows(path: Path) -> tuple[float, list[SpanRow]]:
    """A run's spans.json: its start and its rows, each checked to have a kind and times
    and to name its GPU (`gpu`) or a group of GPUs that did the same (`gpus`)."""
    data = read_json(path, MAX_RECORD_BYTES)
    check(data, SPANS, str(path))
    for i, row in enumerate(data["spans"]):
        if "gpus" not in row:
            check(row, {"gpu": TEXT}, str(path), f"spans[{i}]")
            continue
        check(row["gpus"], [TEXT], str(path), f"spans[{i}].gpus")
        if not row["gpus"]:
            raise InputError("expected at least one GPU", str(path), f"spans[{i}].gpus")
    return float(data["start"]), data["spans"]


def per_gpu(rows: list[SpanRow]) -> list[Span]:
    """Rows as spans of one GPU each: a group's row once on each of its GPUs."""
    out: list[Span] = []
    for row in rows:
        gpus = row.get("gpus")
        if gpus is None:
            out.append(cast(Span, row))  # read_span_rows checked it names its GPU
            continue
        rest = {k: v for k, v in row.items() if k != "gpus"}
        out.extend(cast(Span, {"gpu": gpu, **rest}) for gpu in gpus)
    return out


def load_compare(directory: Path) -> tuple[JsonObject, list[RunEntry]]:
    """compare.json (as read: checked for what report reads of it) and each run's
    results.json, checked."""
    path = directory / "compare.json"
    if not path.exists():
        raise InputError("no compare.json: not a `testbed compare` directory", str(directory))
    data = read_json(path)
    check(data, {"runs": [ENTRY]}, str(path))
    entries = []
    for i, raw in enumerate(data["runs"]):
        relative = PurePosixPath(raw["directory"])
        if relative.is_absolute() or ".." in relative.parts or not relative.parts:
            raise InputError("must be a folder inside the comparison", str(path),
                             f"runs[{i}].directory")
        entry = RunEntry(**{k: raw[k] for k in ENTRY}, results=None)
        results = directory / relative / "results.json"
        if results.exists():  # results on disk are the record; re-read them
            entry.results = read_json(results)
            _check_run(entry.results, str(results))
        entries.append(entry)
    return data, entries


def _check_run(results: Any, where: str) -> None:
    """A run's results.json against the shipped schema; one written before testbed had
    it (no `schema_version`) against the keys report reads."""
    if isinstance(results, dict) and "schema_version" in results:
        check_results(results, where)
        return
    check(results, RESULTS, where)
    for key, shape in LATER_RESULTS.items():
        if results.get(key) is not None:
            check(results[key], shape, where, key)


def load_spans(directory: Path, entry: RunEntry) -> tuple[float, list[Span]]:
    """A comparison's run's spans.json, checked: its start time and spans."""
    return read_spans(directory / entry.directory / "spans.json")


@dataclass(frozen=True)
class SavedRun:
    """A run as its directory holds it, read back and checked."""

    title: str
    """What plots call it: the policy (+ the bubble policy)."""
    results: JsonObject
    """results.json as read (raw: one written before the schema is read too; `typed`)."""
    start: float
    spans: list[Span]
    source: str = "results.json"
    """The results file, for errors about what it holds."""
    typed: Results | None = None
    """`results` as types (testbed.report.run_results); None for a run written before
    testbed's results had a schema, which only the keys `check` names are known of."""

    @property
    def length_s(self) -> float:
        """From the run's start to the last span's end."""
        return max((s["end"] for s in self.spans), default=self.start) - self.start


def load_run(directory: Path) -> SavedRun:
    """One run's directory (`testbed up`'s or `simulate`'s): results.json, checked as
    `testbed report` checks a comparison's runs, and spans.json; a directory that is not a
    run's is refused in one line."""
    path = directory / "results.json"
    if not directory.is_dir():
        raise InputError("no such directory", str(directory))
    if not path.is_file():
        raise InputError("not a run's directory: it has no results.json", str(directory))
    results = read_json(path)
    _check_run(results, str(path))
    typed: Results | None = None
    if "schema_version" in results:  # checked against the schema: it decodes
        typed = from_json(results, Results, str(path))
    start, spans = read_spans(directory / "spans.json")
    bubble = results.get("bubble_policy")
    title = f"{results.get('policy', directory.name)}" + (f"+{bubble}" if bubble else "")
    return SavedRun(title, results, start, spans, str(path), typed)


def read_spans(path: Path) -> tuple[float, list[Span]]:
    """A run's spans.json, checked: its start time and spans, one GPU each."""
    start, rows = read_span_rows(path)
    for i, span in enumerate(rows):
        if span["kind"] == "transfer":
            check({"link": span.get("link"), "bytes": span.get("bytes", 0)}, TRANSFER,
                  str(path), f"spans[{i}]")
        if span["kind"] == "step":
            check(span.get("iteration"), INTEGER, str(path), f"spans[{i}].iteration")
    return start, per_gpu(rows)
