"""Link traces: a WAN link's bandwidth (and latency, loss) over time, from a CSV file of
measurements or a seeded generator (`diurnal`, `random-walk`), for one direction or both.

Interpolation is a step: each row's values hold from its time until the next row that
gives that column (each column on its own), the last ones for the rest of the run; before
the first row the link has the topology's values. A trace becomes network events
(testbed.topology.net_events), one per row and column, beneath any event on the same link, so
both backends apply it as they apply events: the emulator by changing the live link, the
simulator by changing its capacities and latencies.
"""

from __future__ import annotations

import csv
import io
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from testbed.common.codec import JsonObject
from testbed.common.fields import Fields, bounded, integer, positive
from testbed.common.input_files import MIB, read_input
from testbed.common.units import format_rate, parse_duration, parse_fraction
from testbed.errors import InputError, join_key
from testbed.topology.limits import DC_LATENCY, MAX_LATENCY_S, MAX_RATE_BPS, MIN_RATE_BPS, RATE
from testbed.topology.model import Topology
from testbed.topology.net_events import NetEvent

MAX_STEPS = 100_000
"""Rows (or generated steps) per trace: a day at one a second is 86,400."""
MAX_TRACE_BYTES = 16 * MIB
"""A trace file: MAX_STEPS rows of up to 160 bytes (`86399.5,987.654Mbit,40.25ms,0.5%` is
33), comments included. A larger file is refused before it is read, and rows are counted
as they are read, so one of millions of short rows is refused at row MAX_STEPS + 1, not
after all of it is parsed (4 million took 38 s and 1.6 GB)."""
COLUMNS = ("time_s", "bandwidth", "latency", "loss")
GENERATORS = ("diurnal", "random-walk")
FORMS = {
    "time_s": "a time like '10s' or 10 (seconds), finite, not negative",
    "bandwidth": f"a rate like '10Gbit', from {format_rate(MIN_RATE_BPS)} to "
                 f"{format_rate(MAX_RATE_BPS)}",
    "latency": f"a one-way latency like '40ms', from 0 to {MAX_LATENCY_S:g}s",
    "loss": "a loss like '1%', below 100% (an outage is an event's `down`)",
}
"""What each column takes, as its errors say (they never quote the cell)."""
INTERPOLATION = "step"
"""How a trace's values are held between rows (recorded with the run)."""


@dataclass(frozen=True)
class TracePoint:
    at_s: float
    bandwidth_bps: float | None
    latency_s: float | None
    """One-way, router to router; None: as the last row that gave one."""
    loss: float | None


class TraceRates(TypedDict):
    min: float
    max: float


TraceRecord = TypedDict("TraceRecord", {
    "link": str, "csv": NotRequired[str], "diurnal": NotRequired[JsonObject],
    "random-walk": NotRequired[JsonObject], "steps": int, "interpolation": str,
    "bandwidth": TraceRates | None, "applied": NotRequired[bool],
    "steps_applied": NotRequired[int]})
"""A link trace as results.json records it: the scenario's entry (its CSV file or its
generator's settings, as given), its steps, the range of its rates; testbed.scenario.reach
adds whether training reached it and how many of its steps."""


@dataclass(frozen=True)
class LinkTrace:
    a: str
    b: str
    one_way: bool
    """Only a->b (what a's router sends to b); False: both directions."""
    name: str
    """The CSV file as given, or the generator's name."""
    points: tuple[TracePoint, ...]
    raw: JsonObject
    """The scenario entry, as given (a generator's settings are its own, raw)."""

    @property
    def link(self) -> str:
        return f"{self.a}>{self.b}" if self.one_way else f"{self.a}-{self.b}"

    def events(self) -> list[NetEvent]:
        """One event per row and column, lasting until the next row that gives the
        column (the last one for the rest of the run)."""
        out: list[NetEvent] = []
        for kind, value_of in (("bandwidth", _bandwidth), ("latency", _latency),
                               ("loss", _loss)):
            given = [(p.at_s, v) for p in self.points if (v := value_of(p)) is not None]
            for i, (at, value) in enumerate(given):
                duration = given[i + 1][0] - at if i + 1 < len(given) else None
                out.append(NetEvent(at, self.a, self.b, kind, value, duration,
                                    one_way=self.one_way, trace=self.name))
        return out

    def describe(self) -> TraceRecord:
        """What results record of it: the entry, and what it came to."""
        rates = [p.bandwidth_bps for p in self.points if p.bandwidth_bps is not None]
        out: TraceRecord = {
            "link": self.link, "steps": len(self.points), "interpolation": INTERPOLATION,
            "bandwidth": {"min": min(rates), "max": max(rates)} if rates else None}
        if "csv" in self.raw:
            out["csv"] = self.raw["csv"]
        if "diurnal" in self.raw:
            out["diurnal"] = self.raw["diurnal"]
        if "random-walk" in self.raw:
            out["random-walk"] = self.raw["random-walk"]
        return out


def _bandwidth(point: TracePoint) -> float | None:
    return point.bandwidth_bps


def _latency(point: TracePoint) -> float | None:
    return point.latency_s


def _loss(point: TracePoint) -> float | None:
    return point.loss


def parse_trace(item: Any, topology: Topology, source: str | None, key: str,
                base: Path) -> LinkTrace:
    """A `traces` entry: `link` (`[a, b]` or `a-b` for both directions, `a>b` for one)
    and one of `csv: FILE` (relative to `base`), `diurnal: {...}`, `random-walk: {...}`."""
    fields = Fields(item, source, key, ("link", "csv", *GENERATORS))
    fields.check_keys()
    a, b, one_way = parse_link(fields, topology)
    present = [k for k in ("csv", *GENERATORS) if fields.has(k)]
    if len(present) != 1:
        raise fields.error(None, f"give exactly one of csv, {', '.join(GENERATORS)}")
    kind = present[0]
    if kind == "csv":
        name = fields.get("csv", _file_name)
        points = read_trace_csv(base / name, display=name)
    else:
        section = fields.section(kind, required=True)
        assert section is not None
        points = (diurnal if kind == "diurnal" else random_walk)(section)
        name = kind
    fields.done()
    return LinkTrace(a, b, one_way, name, points, dict(item))


def parse_link(fields: Fields, topology: Topology) -> tuple[str, str, bool]:
    """`link`: `[a, b]` or `a-b` (both directions) or `a>b` (one); a WAN link of the
    topology."""
    link = fields.raw("link")
    one_way = isinstance(link, str) and ">" in link
    if isinstance(link, str):
        link = link.split(">" if one_way else "-")
    if not (isinstance(link, list) and len(link) == 2 and all(isinstance(x, str) for x in link)):
        raise fields.error("link", "expected two datacenters: [east, west] or east-west "
                           "(both directions), east>west (one)")
    a, b = link
    if not topology.has_link(a, b):
        raise fields.error("link", f"no WAN link between {a!r} and {b!r}")
    return a, b, one_way


def _file_name(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a file name, got {value!r}")
    return value


def read_trace_csv(path: Path, display: str | None = None) -> tuple[TracePoint, ...]:
    """A trace file: a header naming its columns (`time_s` and `bandwidth`, then
    `latency` and `loss` if given, in any order), then one row per time. Cells take
    units as topology files do (`500Mbit`, `40ms`, `1%`); a bare number is bit/s,
    seconds, a fraction. An empty latency or loss cell leaves it as it was; a line
    whose first cell starts with `#` is a comment. Line numbers in errors count every
    line. An error names the file, the line and the column, never what the file holds:
    a scenario may name any file (as root, /etc/shadow), and a message quoting it would
    show its first line."""
    source = str(path)
    reader = csv.reader(io.StringIO(read_input(path, MAX_TRACE_BYTES)))
    numbered: list[tuple[int, list[str]]] = []
    try:
        for row in reader:
            if any(c.strip() for c in row) and not row[0].lstrip().startswith("#"):
                numbered.append((reader.line_num, row))
                if len(numbered) > MAX_STEPS + 1:  # the header and one row too many
                    raise InputError(f"more than {MAX_STEPS:,} rows: a trace has at most "
                                     f"{MAX_STEPS:,}", source, f"line {reader.line_num}")
    except csv.Error as exc:
        raise InputError(f"not CSV: {exc}", source, f"line {reader.line_num}") from None
    rows = [row for _, row in numbered]
    if not rows:
        raise InputError("empty trace: expected a header (time_s,bandwidth[,latency,loss]) "
                         "and rows", source)
    header = [cell.strip() for cell in rows[0]]
    for column, name in enumerate(header, start=1):
        if name not in COLUMNS:
            raise InputError(f"column {column} is not one of {', '.join(COLUMNS)}", source,
                             "header")
    for name in ("time_s", "bandwidth"):
        if name not in header:
            raise InputError(f"no {name!r} column (columns: time_s, bandwidth[, latency, "
                             "loss])", source, "header")
    if len(set(header)) != len(header):
        raise InputError("a column is named twice", source, "header")
    points: list[TracePoint] = []
    for number, row in numbered[1:]:
        where = f"line {number}"
        if len(row) != len(header):
            raise InputError(f"{len(row)} cells, the header has {len(header)}", source, where)
        cells = dict(zip(header, (cell.strip() for cell in row), strict=True))
        at = _cell(cells, "time_s", _time, source, where, required=True)
        assert at is not None
        if points and at <= points[-1].at_s:
            raise InputError("time is not after the previous row's", source,
                             join_key(where, "time_s"))
        points.append(TracePoint(
            at, _cell(cells, "bandwidth", RATE, source, where, required=True),
            _cell(cells, "latency", DC_LATENCY, source, where),
            _cell(cells, "loss", trace_loss, source, where)))
    if not points:
        raise InputError("no rows after the header", source)
    return tuple(points)


def _cell(cells: dict[str, str], name: str, parse: Callable[[Any], float], source: str,
          where: str, required: bool = False) -> float | None:
    text = cells.get(name, "")
    if text == "":
        if required:
            raise InputError("missing value", source, join_key(where, name))
        return None
    try:
        return float(parse(text))
    except ValueError:
        raise InputError(f"expected {FORMS[name]}", source, join_key(where, name)) from None


def _time(value: Any) -> float:
    seconds = parse_duration(value)
    if not math.isfinite(seconds):
        raise ValueError(f"expected a finite time, got {value!r}")
    return seconds


def trace_loss(value: Any) -> float:
    """Loss below 100%: a link that is down is an event (`down: 5s`), whose outage both
    backends model as one."""
    loss = parse_fraction(value)
    if loss >= 1.0:
        raise ValueError(f"must be below 100%, got {value!r} (an outage is an event's "
                         "`down`)")
    return loss


# --- generators ------------------------------------------------------------------------


def diurnal(section: Fields) -> tuple[TracePoint, ...]:
    """Bandwidth that swings between `high` (at the start, with `phase` 0) and `low`
    (half a `period` later) as a cosine, sampled every `step` (default period / 24)
    for `for`; `noise`: a lognormal factor of mean 1 and that coefficient of variation
    per step, seeded by `seed`."""
    low, high = section.get("low", RATE), section.get("high", RATE)
    if high < low:
        raise section.error("high", f"must not be below low ({format_rate(low)})")
    period = section.get("period", positive(parse_duration))
    step, steps = _steps(section, period / 24)
    phase = section.get("phase", bounded(parse_fraction, 0.0, 1.0, str), 0.0)
    noisy = _noise(section)
    section.done()
    points = []
    for i in range(steps):
        t = i * step
        swing = (1 + math.cos(2 * math.pi * (t / period + phase))) / 2
        points.append(_point(t, noisy(low + (high - low) * swing)))
    return tuple(points)


def random_walk(section: Fields) -> tuple[TracePoint, ...]:
    """Bandwidth from `start` (default `high`), each `step` (default 1 s) times a
    lognormal factor of coefficient of variation `sigma` (default 10%), kept inside
    [`low`, `high`] by reflection, for `for`; seeded by `seed`."""
    low, high = section.get("low", RATE), section.get("high", RATE)
    if high < low:
        raise section.error("high", f"must not be below low ({format_rate(low)})")
    start = section.get("start", RATE, high)
    if not low <= start <= high:
        raise section.error("start", "must be from low to high")
    step, steps = _steps(section, 1.0)
    sigma = section.get("sigma", parse_fraction, 0.1)
    rng = random.Random(section.get("seed", integer, 0))
    section.done()
    spread = math.sqrt(math.log1p(sigma * sigma))
    value, points = start, []
    for i in range(steps):
        points.append(_point(i * step, value))
        value *= math.exp(rng.gauss(-spread * spread / 2, spread))
        value = _reflect(value, low, high)
    return tuple(points)


def _steps(section: Fields, default_step: float) -> tuple[float, int]:
    length = section.get("for", positive(parse_duration))
    step = section.get("step", positive(parse_duration), default_step)
    steps = math.ceil(length / step)
    if steps > MAX_STEPS:
        raise section.error("step", f"{steps:,} steps over {length:g} s: at most "
                            f"{MAX_STEPS:,} (take a longer step)")
    return step, steps


def _noise(section: Fields) -> Callable[[float], float]:
    cv = section.get("noise", parse_fraction, 0.0)
    rng = random.Random(section.get("seed", integer, 0))
    spread = math.sqrt(math.log1p(cv * cv))

    def noisy(value: float) -> float:
        return value * math.exp(rng.gauss(-spread * spread / 2, spread)) if cv else value

    return noisy


def _reflect(value: float, low: float, high: float) -> float:
    """Keep a walk inside [low, high] by reflecting it off the bound it crossed (in
    log space, as it moves)."""
    if low == high:
        return low
    span = math.log(high / low)
    x = math.log(value / low) % (2 * span)
    return low * math.exp(x if x <= span else 2 * span - x)


def _point(t: float, bandwidth: float) -> TracePoint:
    clipped = min(MAX_RATE_BPS, max(MIN_RATE_BPS, bandwidth))
    return TracePoint(t, clipped, None, None)
