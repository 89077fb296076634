"""A scenario's failure in the simulator: the first that takes a GPU of the plan ends the
run at its time, with what ended before it (testbed.run.segments goes on from there)."""

from __future__ import annotations

from collections.abc import Sequence

from testbed.common.span_table import SpanTable
from testbed.scenario.scenario import WorkerLoss
from testbed.topology.net_events import NetEvent, event_spans


def first_loss(losses: Sequence[WorkerLoss], gpus: Sequence[str]) -> WorkerLoss | None:
    """The earliest failure, from the run's start on, that takes one of `gpus`."""
    used = set(gpus)
    return min((loss for loss in losses if loss.worker in used and loss.at_s >= 0),
               key=lambda loss: loss.at_s, default=None)


def spans_before(spans: SpanTable, at_s: float, events: Sequence[NetEvent]) -> SpanTable:
    """The spans that ended by `at_s`, and the events' until then."""
    kept = SpanTable()
    for row in spans.rows():
        if row[3] <= at_s:  # its end
            kept.add(*row)
    kept.extend(event_spans(events, 0.0, at_s))
    return kept
