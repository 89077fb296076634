"""Network events during a run: a WAN link goes down and comes back, its latency or
bandwidth changes, a burst of loss. From the topology's `events` section or `--event`
flags; applied by both backends at the same times, and shown in the trace."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from testbed.errors import InputError
from testbed.fields import Fields
from testbed.spans import Span
from testbed.topology.limits import DC_LATENCY, RATE
from testbed.topology.model import Topology
from testbed.units import parse_duration, parse_fraction

KINDS = ("down", "latency", "bandwidth", "loss")


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

    def as_raw(self) -> dict[str, Any]:
        """The event as a topology's `events` entry (in seconds and bit/s)."""
        raw: dict[str, Any] = {"at": f"{self.at_s:g}s", "link": [self.a, self.b]}
        if self.kind == "down":
            raw["down"] = f"{self.for_s:g}s"
            return raw
        raw[self.kind] = {"latency": f"{self.value:g}s", "bandwidth": f"{self.value:g}bit",
                          "loss": f"{self.value * 100:g}%"}[self.kind]
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
        return f"{self.a}<->{self.b} {what} at {self.at_s:g} s{span}"


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
    item: dict[str, Any] = {}
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
    """Events as timed link settings. Where events on one link overlap, the one that
    started last is in force, and when it ends the one beneath it (or the topology's
    value) comes back."""
    fields = {"down": "loss", "loss": "loss", "latency": "latency_s",
              "bandwidth": "bandwidth_bps"}
    groups: dict[tuple[str, str, str], list[NetEvent]] = {}
    for event in events:
        key = (*sorted((event.a, event.b)), fields[event.kind])
        groups.setdefault((key[0], key[1], key[2]), []).append(event)
    out: list[Change] = []
    for (a, b, field), group in groups.items():
        link = topology.link(a, b)
        base = {"loss": link.loss, "latency_s": link.latency_s,
                "bandwidth_bps": link.bandwidth_bps}[field]
        ordered = sorted(group, key=lambda e: e.at_s)
        points = sorted({e.at_s for e in ordered} | {_end(e) for e in ordered
                                                     if e.for_s is not None})
        current = base
        for t in points:
            active = [e for e in ordered if e.at_s <= t < _end(e)]
            value = active[-1].value if active else base
            starting = [e for e in ordered if e.at_s == t]
            cause, revert = (starting[-1], False) if starting else \
                (next(e for e in ordered if _end(e) == t), True)
            if value == current:
                continue
            current = value
            out.append(_change(t, cause, a, b, field, value, revert))
    return sorted(out, key=lambda c: c.at_s)


def _end(event: NetEvent) -> float:
    return event.at_s + event.for_s if event.for_s is not None else float("inf")


def _change(at: float, event: NetEvent, a: str, b: str, field: str, value: float,
            revert: bool) -> Change:
    return Change(at, a, b,
                  latency_s=value if field == "latency_s" else None,
                  bandwidth_bps=value if field == "bandwidth_bps" else None,
                  loss=value if field == "loss" else None, event=event, revert=revert)


def event_spans(events: Sequence[NetEvent], start: float, end: float) -> list[Span]:
    """Trace spans for events that happened before `end` (run-relative seconds)."""
    return [
        {
            "gpu": "network",
            "kind": "net_event",
            "start": start + e.at_s,
            "end": start + min(end, e.at_s + (e.for_s if e.for_s is not None else end)),
            "iteration": -1,
            "link": f"{e.a}>{e.b}",
            "detail": e.describe(),
        }
        for e in events
        if e.at_s <= end
    ]
