"""Which of a run's network events and scenario entries its training reached. One that
starts after training ended is never applied, so a run says which, in its results and in
a warning that names them and the `--iterations` that would reach them. Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from testbed.common.units import plural
from testbed.scenario.scenario import Scenario, ScenarioRecord
from testbed.topology.net_events import EventEntry, NetEvent

Section = Literal["events", "traces", "stragglers", "failures"]
NAMED = 4
"""Late entries a warning names; the rest it counts."""
MARGIN = 0.1
"""How far past the latest entry the suggested iterations go, as a share of the time to
it."""


@dataclass(frozen=True)
class Entry:
    """A network event or a scenario's trace, straggler or failure, by when it starts
    (seconds from the start of training)."""

    section: Section
    at_s: float
    what: str
    worker: str | None = None
    """A failure's GPU."""


def entries(events: Sequence[NetEvent], scenario: Scenario) -> list[Entry]:
    """The run's events (the topology's, the scenario's, `--event`'s), then the scenario's
    traces, stragglers and failures, each in its file's order (as results.json lists
    them)."""
    out = [Entry("events", e.at_s, f"event {e.describe()}") for e in events]
    for trace in scenario.traces:
        first = min((p.at_s for p in trace.points), default=0.0)
        out.append(Entry("traces", first, f"trace {trace.name} on {trace.link} from "
                                          f"{first:g} s"))
    for s in scenario.stragglers:
        lasting = f" for {s.for_s:g} s" if s.for_s is not None else ""
        out.append(Entry("stragglers", s.at_s, f"straggler {s.gpu or s.dc} {s.slower:g}x "
                                               f"slower at {s.at_s:g} s{lasting}"))
    out += [Entry("failures", f.at_s, f.describe(), f.worker) for f in scenario.failures]
    return out


@dataclass(frozen=True)
class Reach:
    """The entries, whether each was applied, and when training ended."""

    entries: tuple[Entry, ...]
    applied: tuple[bool, ...]
    end_s: float
    """The end of the run's last span, in seconds from the start of training."""

    @property
    def late(self) -> list[Entry]:
        return [e for e, applied in zip(self.entries, self.applied, strict=True)
                if not applied]

    def of(self, section: Section) -> list[bool]:
        return [applied for e, applied in zip(self.entries, self.applied, strict=True)
                if e.section == section]


def reach(found: Sequence[Entry], end_s: float,
          failed: Collection[tuple[str, float]] = ()) -> Reach:
    """An entry is applied when it starts before training ended; a failure also when the
    run recorded it (`failed`: worker and time of each; one that stopped the run is its
    end)."""
    def recorded(e: Entry) -> bool:
        return e.section == "failures" and any(
            worker == e.worker and math.isclose(at, e.at_s, abs_tol=1e-6)
            for worker, at in failed)

    return Reach(tuple(found), tuple(e.at_s < end_s or recorded(e) for e in found), end_s)


@dataclass(frozen=True)
class Applied:
    """results.json's `events` and `scenario`, each entry with `applied` (a trace also
    with `steps_applied`: its steps that began before training ended)."""

    events: list[EventEntry]
    """Each network event as a topology's `events` entry."""
    scenario: ScenarioRecord | None
    """The scenario file's traces, stragglers and failures, and its recovery."""


def applied_results(events: Sequence[NetEvent], scenario: Scenario, reached: Reach
                    ) -> Applied:
    """Which of `events` and `scenario`'s entries `reached` says training reached."""
    entries = [e.as_raw() for e in events]
    for entry, applied in zip(entries, reached.of("events"), strict=True):
        entry["applied"] = applied
    block = scenario.as_results()
    if block is not None:
        for failure, applied in zip(block["failures"], reached.of("failures"), strict=True):
            failure["applied"] = applied
        for straggler, applied in zip(block["stragglers"], reached.of("stragglers"),
                                      strict=True):
            straggler["applied"] = applied
        for raw, applied, trace in zip(block["traces"], reached.of("traces"),
                                       scenario.traces, strict=True):
            raw["applied"] = applied
            raw["steps_applied"] = sum(p.at_s < reached.end_s for p in trace.points)
    return Applied(entries, block)


def iterations_to_reach(at_s: float, done: int, last_end_s: float, iteration_s: float,
                        period: int = 1) -> int:
    """Iterations enough for training to go on past `at_s`: those done (the last ending
    at `last_end_s`), then as many of `iteration_s` as reach MARGIN beyond it (iterations
    vary, an emulated run's more than a simulated one's) and one more (an iteration for
    the entry to act on), in whole cycles of `period`."""
    more = math.ceil(max(0.0, at_s - last_end_s) * (1 + MARGIN) / iteration_s) + 1
    return -(-(done + more) // period) * period


def late_warning(late: Sequence[Entry], end_s: float, iterations: int | None,
                 iteration_s: float | None) -> str:
    """One line: which entries training ended before, and how many iterations would
    reach them."""
    named = "; ".join(e.what for e in late[:NAMED])
    more = f"; and {len(late) - NAMED} more" if len(late) > NAMED else ""
    one = len(late) == 1
    hint = "" if iterations is None or iteration_s is None else \
        f"; --iterations {iterations} would reach {'it' if one else 'them'} (about " \
        f"{iteration_s:.3g} s an iteration)"
    what = plural(len(late), "event or scenario entry", "events or scenario entries")
    return (f"training ended at {end_s:.3g} s, before {what} began, so "
            f"{'it was' if one else 'they were'} never applied: {named}{more}{hint}")
