"""Chrome / Perfetto trace: one process per datacenter, one track per GPU, arrows from each
send to its receive. Written as gzip-compressed JSON (trace.json.gz), which ui.perfetto.dev
and chrome://tracing open as they are.

`summary` (the default) keeps a large run's trace to what a viewer can show: every GPU
while there are at most SUMMARY_GPUS of them; past that, one track per pipeline stage's
GPU group (its lead GPU: a tensor-parallel group's spans are the same on every GPU) in as
many whole replicas as fit in SUMMARY_GPUS tracks. `full` draws every GPU.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal, Required, TypedDict

from testbed.common.choices import TraceChoice
from testbed.common.fsutil import atomic_output
from testbed.common.span_table import rows
from testbed.common.spans import Span, SpanDetail, SpanKind
from testbed.common.units import plural
from testbed.plan.model import Plan
from testbed.report.stream import write_json_items
from testbed.topology import Topology

SUMMARY_GPUS = 256
"""Tracks a summary trace keeps at most (whole replicas, at least one)."""
TRACE_FILE = "trace.json.gz"

class Track(TypedDict):
    pid: int
    tid: int


class TraceEvent(TypedDict, total=False):
    """One event of Chrome's Trace Event Format, as far as testbed writes it: metadata
    (M), a span (X), a flow's start and end (s, f), a counter (C), an instant (i)."""

    ph: Required[Literal["M", "X", "s", "f", "C", "i"]]
    name: str
    cat: str
    pid: int
    tid: int
    ts: float
    dur: float
    id: int
    bp: str
    """A flow's end binds to the enclosing slice (`e`)."""
    s: str
    """An instant's scope: global (g), process (p)."""
    args: dict[str, object]


_SHOWN: frozenset[SpanKind] = frozenset((
    "forward",
    "backward",
    "step",
    "outer_step",
    "allreduce",
    "wait_reduce",
    "recv",
    "wait_grant",
    "wait_send",
    "prefill",
    "send",
    "kv_transfer",
    "net_event",
    "failure",
))


def _label(kind: SpanKind, detail: SpanDetail) -> str:
    """A compute as the plan writes it (`2F0`, `1B3`, a split backward's `1I3`, `1W3`)."""
    mb = detail.get("microbatch")
    short = {"forward": "F", "backward": detail.get("part", "B")}.get(kind)
    if short and mb is not None:
        return f"{detail.get('stage', '')}{short}{mb}"
    return kind if mb is None else f"{kind} {mb}"


def trace_scope(plan: Plan, detail: TraceChoice) -> tuple[frozenset[str] | None, str | None]:
    """The GPUs whose tracks the trace draws (None: every GPU) and, when that leaves some
    out, one line saying what."""
    gpus = plan.used_gpus()
    if detail == "full" or len(gpus) <= SUMMARY_GPUS:
        return None, None
    # a replica's tracks: its groups' lead GPUs, fewer than its stages where a GPU holds
    # several (virtual stages)
    per_replica = len({plan.lead_gpu(0, s) for s in range(plan.pp)})
    replicas = max(1, SUMMARY_GPUS // per_replica)
    kept = frozenset(plan.lead_gpu(r, s) for r in range(min(replicas, plan.dp))
                     for s in range(plan.pp))
    which = "replica 0" if replicas == 1 else f"replicas 0-{min(replicas, plan.dp) - 1}"
    group = " (the lead GPU of each tensor-parallel group)" if plan.tp > 1 else ""
    return kept, (f"trace: {plural(len(kept), 'track')} of {len(gpus):,} GPUs, {which} of "
                  f"{plan.dp}{group}; --trace full draws every GPU")


class _Tracks:
    """The trace's processes (one per datacenter, and the network's) and threads (one per
    GPU), each named the first time an event lands on it."""

    def __init__(self, topology: Topology) -> None:
        self.pids = {dc.name: i + 1 for i, dc in enumerate(topology.datacenters)}
        self.tids: dict[str, int] = {}
        self.network_named = False

    def processes(self) -> Iterator[TraceEvent]:
        for dc, pid in self.pids.items():
            yield {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": dc}}

    def on(self, gpu: str) -> Iterator[TraceEvent]:
        """The name of `gpu`'s track, if not yet given (and the network's process', the
        first time a track lies outside every datacenter)."""
        if gpu in self.tids:
            return
        pid = self.pids.get(gpu.rsplit("-", 1)[0], 0)
        if pid == 0 and not self.network_named:
            self.network_named = True
            yield {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "network"}}
        self.tids[gpu] = len(self.tids) + 1
        yield {"ph": "M", "name": "thread_name", "pid": pid, "tid": self.tids[gpu],
               "args": {"name": gpu}}

    def where(self, gpu: str) -> Track:
        return {"pid": self.pids.get(gpu.rsplit("-", 1)[0], 0), "tid": self.tids[gpu]}


def trace_events(spans: Sequence[Span], start: float, topology: Topology,
                 kept: frozenset[str] | None = None) -> Iterator[TraceEvent]:
    """The trace's events in span order, each track's name first; with `kept`, only those
    GPUs' tracks (a span of a group drawn once, on its first GPU kept)."""
    tracks = _Tracks(topology)
    yield from tracks.processes()

    def us(t: float) -> float:
        return round((t - start) * 1e6, 3)

    drawn_of: dict[tuple[str, ...], Sequence[str]] = {}
    """What each group of GPUs is drawn on: all of them, or its first kept one (if any)."""
    flow = 0
    for group, kind, begin, end, iteration, detail in rows(spans):
        if kind == "transfer" and detail.get("src"):
            src, dst = detail["src"], detail["dst"]
            if kept is None or (src in kept and dst in kept):
                flow += 1
                yield from _arrow(tracks, flow, src, dst, us(begin), us(end))
            continue
        if kind not in _SHOWN:
            continue
        drawn = drawn_of.get(group)
        if drawn is None:
            drawn = drawn_of[group] = group if kept is None else [
                g for g in group if g in kept or g == "network"][:1]
        args = {"iteration": iteration, **detail}
        ts, stop = us(begin), us(end)
        for gpu in drawn:
            yield from tracks.on(gpu)
            at = tracks.where(gpu)
            yield {"ph": "X", "name": _label(kind, detail), "cat": kind, "pid": at["pid"],
                   "tid": at["tid"], "ts": ts, "dur": max(0.0, stop - ts), "args": args}


def _arrow(tracks: _Tracks, flow: int, src: str, dst: str, begin_us: float, end_us: float
           ) -> Iterator[TraceEvent]:
    """A transfer as an arrow from its sender's track to its receiver's."""
    yield from tracks.on(src)
    yield from tracks.on(dst)
    at, to = tracks.where(src), tracks.where(dst)
    yield {"ph": "s", "id": flow, "name": "tensor", "cat": "transfer", "pid": at["pid"],
           "tid": at["tid"], "ts": begin_us}
    yield {"ph": "f", "bp": "e", "id": flow, "name": "tensor", "cat": "transfer",
           "pid": to["pid"], "tid": to["tid"], "ts": end_us}


def write_trace(path: Path, events: Iterable[TraceEvent]) -> None:
    """The events as one gzip-compressed JSON trace, written as they come."""
    with atomic_output(path) as raw, gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1,
                                                   mtime=0) as out:
        write_json_items(out, b'{"displayTimeUnit":"ms","traceEvents":[', events, b"]}")
