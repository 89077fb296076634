"""Network events during a run: a WAN link goes down and comes back, its latency or
bandwidth changes, a burst of loss. From the topology's `events` section or `--event`
flags; applied by both backends at the same times, and shown in the trace."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NotRequired, TypedDict

from testbed.common.codec import JsonObject
from testbed.common.fields import Fields
from testbed.common.spans import Span
from testbed.common.units import parse_duration, parse_fraction
from testbed.errors import InputError
from testbed.topology.limits import DC_LATENCY, RATE
from testbed.topology.model import Topology

KINDS = ("down", "latency", "bandwidth", "loss")


EventEntry = TypedDict("EventEntry", {
    "at": str, "link": list[str], "down": NotRequired[str], "latency": NotRequired[str],
    "bandwidth": NotRequired[str], "loss": NotRequired[str], "for": NotRequired[str],
    "applied": NotRequired[bool]})
"""A network event as a topology's `events` entry (`for` is a keyword in Python, hence
the functional form); results.json's entries add `applied` (testbed.scenario.reach)."""


@dataclass(frozen=True)
class NetEvent:
    at_s: float
    a: str
    b: str
    kind: str
    """down, latency, bandwidth or loss."""
    value: float
    """New latency (s), bandwidth (bit/s) or loss (fraction); 1 for down."""
    for_s: float | None
    """How long it lasts; None: for the rest of the run."""
    one_way: bool = False
    """Only the direction a->b (a link trace's); False: both directions."""
    trace: str | None = None
    """The link trace this is a step of (testbed.scenario.link_traces), else None: a trace is
    beneath events on the same link and property, and is shown as one span, not per
    step."""

    def as_raw(self) -> EventEntry:
        """The event as a topology's `events` entry (in seconds and bit/s)."""
        raw: EventEntry = {"at": f"{self.at_s:g}s", "link": [self.a, self.b]}
        if self.kind == "down":
            raw["down"] = f"{self.for_s:g}s"
            return raw
        if self.kind == "latency":
            raw["latency"] = f"{self.value:g}s"
        elif self.kind == "bandwidth":
            raw["bandwidth"] = f"{self.value:g}bit"
        else:
            raw["loss"] = f"{self.value * 100:g}%"
        if self.for_s is not None:
            raw["for"] = f"{self.for_s:g}s"
        return raw

    def describe(self) -> str:
        what = {
            "down": "down",
            "latency": f"latency {self.value * 1e3:g} ms",
            "bandwidth": f"bandwidth {self.value / 1e6:g} Mbit/s",
            "loss": f"loss {self.value:.1%}",
        }[self.kind]
        span = f" for {self.for_s:g} s" if self.for_s is not None else ""
        return f"{self.a}{'>' if self.one_way else '<->'}{self.b} {what} at {self.at_s:g} s{span}"


@dataclass(frozen=True)
class Change:
    """What to set on a link at a time; None leaves a property as it is."""

    at_s: float
    a: str
    b: str
    latency_s: float | None = None
    bandwidth_bps: float | None = None
    loss: float | None = None
    event: NetEvent | None = None
    revert: bool = False
    one_way: bool = False
    """Only the direction a->b; False: both."""


def parse_events(
    raw: Any, topology: Topology, source: str | None, key: str = "events"
) -> tuple[NetEvent, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise InputError("expected a list of events", source, key)
    return tuple(parse_event(item, topology, source, f"{key}[{i}]") for i, item in enumerate(raw))


def parse_event(item: Any, topology: Topology, source: str | None, key: str) -> NetEvent:
    fields = Fields(item, source, key, ("at", "link", "for", *KINDS))
    fields.check_keys()  # a misspelled kind is named as such, not as no kind given
    at = fields.get("at", _nonnegative(parse_duration))
    link = fields.raw("link")
    if isinstance(link, str):
        link = link.split("-")
    if not (isinstance(link, list) and len(link) == 2 and all(isinstance(x, str) for x in link)):
        raise fields.error("link", "expected two datacenters, like [east, west] or east-west")
    a, b = link
    if not topology.has_link(a, b):
        raise fields.error("link", f"no WAN link between {a!r} and {b!r}")
    present = [k for k in KINDS if fields.has(k)]
    if len(present) != 1:
        raise fields.error(None, f"give exactly one of {', '.join(KINDS)}")
    kind = present[0]
    duration = fields.get("for", _nonnegative(parse_duration), None)
    if kind == "down":
        value, duration = 1.0, fields.get("down", _nonnegative(parse_duration))
    elif kind == "latency":
        value = fields.get("latency", DC_LATENCY)
    elif kind == "bandwidth":
        value = fields.get("bandwidth", RATE)
    else:
        value = fields.get("loss", parse_fraction)
    fields.done()
    return NetEvent(at, a, b, kind, value, duration)


def parse_event_flag(text: str, topology: Topology) -> NetEvent:
    """`at=30s,link=east-west,down=10s` (the same keys as a topology's `events`)."""
    item: JsonObject = {}  # the flag as a raw entry, checked as a file's is
    for part in text.split(","):
        k, sep, v = part.partition("=")
        if not sep:
            raise InputError(f"expected KEY=VALUE pairs, got {part!r}", "--event")
        item[k.strip()] = v.strip()
    return parse_event(item, topology, "--event", "")


def _nonnegative(parse: Any) -> Any:
    def check(value: Any) -> float:
        result = float(parse(value))
        if result < 0:
            raise ValueError(f"must not be negative, got {value!r}")
        return result

    return check


def changes(events: Sequence[NetEvent], topology: Topology) -> list[Change]:
    """Events as timed link settings, per link direction. Where events on one direction
    and property overlap, the one that started last is in force (a link trace's steps
    beneath any event), and when it ends the one beneath it (or the topology's value)
    comes back. A change made alike on both directions is one two-way Change."""
    groups: dict[tuple[str, str, str], list[tuple[int, NetEvent]]] = {}
    for order, event in enumerate(events):
        field = _FIELDS[event.kind]
        directions = [(event.a, event.b)] if event.one_way else [(event.a, event.b),
                                                                 (event.b, event.a)]
        for src, dst in directions:
            groups.setdefault((src, dst, field), []).append((order, event))
    one_way: list[Change] = []
    for (src, dst, field), group in groups.items():
        one_way += _direction_changes(src, dst, field, group, topology)
    return _pair_up(one_way)


_FIELDS = {"down": "loss", "loss": "loss", "latency": "latency_s", "bandwidth": "bandwidth_bps"}


def _direction_changes(src: str, dst: str, field: str, group: list[tuple[int, NetEvent]],
                       topology: Topology) -> list[Change]:
    """One direction's property over time: a sweep over the events' starts and ends,
    the active event of the highest rank (events over traces, then the latest start,
    then the latest listed) in force."""
    link = topology.link(src, dst)
    base = {"loss": link.loss, "latency_s": link.latency_s,
            "bandwidth_bps": link.bandwidth_bps}[field]
    starts = sorted(group, key=lambda item: (item[1].at_s, item[0]))
    ends = sorted((item for item in group if item[1].for_s is not None),
                  key=lambda item: _end(item[1]))
    points = sorted({e.at_s for _, e in group} | {_end(e) for _, e in ends})
    active: dict[int, NetEvent] = {}
    # the active events, highest rank first, and some that ended since: one is dropped
    # when it comes to the top, so a time point costs a logarithm, not a pass over every
    # active event (thousands, each lasting the rest of the run, took minutes)
    ranked: list[tuple[tuple[bool, float, int], int]] = []
    out: list[Change] = []
    current, i, j = base, 0, 0
    for t in points:
        ended: list[NetEvent] = []
        while j < len(ends) and _end(ends[j][1]) <= t:
            ended.append(ends[j][1])
            active.pop(ends[j][0], None)
            j += 1
        starting: list[NetEvent] = []
        while i < len(starts) and starts[i][1].at_s <= t:
            order, event = starts[i]
            if _end(event) > t:
                active[order] = event
                heapq.heappush(ranked, (_descending(order, event), order))
                starting.append(event)
            i += 1
        while ranked and ranked[0][1] not in active:
            heapq.heappop(ranked)
        value = active[ranked[0][1]].value if ranked else base
        if value == current:
            continue
        current = value
        cause, revert = (starting[-1], False) if starting else (ended[-1], True)
        out.append(_change(t, cause, src, dst, field, value, revert))
    return out


def _descending(order: int, event: NetEvent) -> tuple[bool, float, int]:
    """An event's rank, highest first in a heap: events over traces, then the latest
    start, then the latest listed."""
    return (event.trace is not None, -event.at_s, -order)


def _pair_up(changes: list[Change]) -> list[Change]:
    """Changes made alike on both directions of a link at once, as one two-way change
    (named as its event names the link); the rest stay one-way. Sorted by time."""
    by_key: dict[tuple[Any, ...], list[Change]] = {}
    for change in changes:
        key = (change.at_s, frozenset((change.a, change.b)), change.latency_s,
               change.bandwidth_bps, change.loss, id(change.event), change.revert)
        by_key.setdefault(key, []).append(change)
    out: list[Change] = []
    for same in by_key.values():
        if len(same) == 2 and same[0].a != same[1].a:
            first, event = same[0], same[0].event
            a, b = (event.a, event.b) if event is not None else (first.a, first.b)
            out.append(dataclasses.replace(first, a=a, b=b, one_way=False))
        else:
            out += same
    return sorted(out, key=lambda c: c.at_s)


def _end(event: NetEvent) -> float:
    return event.at_s + event.for_s if event.for_s is not None else float("inf")


def _change(at: float, event: NetEvent, a: str, b: str, field: str, value: float,
            revert: bool) -> Change:
    return Change(at, a, b,
                  latency_s=value if field == "latency_s" else None,
                  bandwidth_bps=value if field == "bandwidth_bps" else None,
                  loss=value if field == "loss" else None, event=event, revert=revert,
                  one_way=True)


def event_spans(events: Sequence[NetEvent], start: float, end: float) -> list[Span]:
    """Trace spans for events that happened before `end` (run-relative seconds); a link
    trace is one span from its first step to `end`, not one per step."""
    spans: list[Span] = []
    traced: dict[tuple[str, str, str], NetEvent] = {}
    for e in events:
        if e.at_s > end:
            continue
        if e.trace is not None:
            first = traced.setdefault((e.trace, e.a, e.b), e)
            if e.at_s < first.at_s:
                traced[(e.trace, e.a, e.b)] = e
            continue
        spans.append(_span(e, start, start + min(
            end, e.at_s + (e.for_s if e.for_s is not None else end)), e.describe()))
    for (name, _, _), first in traced.items():
        arrow = ">" if first.one_way else "<->"
        spans.append(_span(first, start, start + end,
                           f"{first.a}{arrow}{first.b} follows trace {name}"))
    return spans


def _span(event: NetEvent, start: float, end: float, detail: str) -> Span:
    return {"gpu": "network", "kind": "net_event", "start": start + event.at_s, "end": end,
            "iteration": -1, "link": f"{event.a}>{event.b}", "detail": detail}
