"""Chrome / Perfetto trace: one process per datacenter, one track per GPU, arrows from each
send to its receive. Open trace.json in ui.perfetto.dev or chrome://tracing."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from testbed.spans import Span, SpanKind
from testbed.topology import Topology

_SHOWN: tuple[SpanKind, ...] = (
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
)


def _label(span: Span) -> str:
    """A compute as the plan writes it (`2F0`, `1B3`, a split backward's `1I3`, `1W3`)."""
    kind = span["kind"]
    mb = span.get("microbatch")
    short = {"forward": "F", "backward": span.get("part", "B")}.get(kind)
    if short and mb is not None:
        return f"{span.get('stage', '')}{short}{mb}"
    return kind if mb is None else f"{kind} {mb}"


def chrome_trace(
    spans: Sequence[Span], start: float, topology: Topology
) -> dict[str, Any]:
    dcs = {dc.name: i + 1 for i, dc in enumerate(topology.datacenters)}
    gpu_ids: dict[str, int] = {}
    events: list[dict[str, Any]] = []
    for dc, pid in dcs.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": dc}})

    def track(gpu: str) -> tuple[int, int]:
        dc = gpu.rsplit("-", 1)[0]
        pid = dcs.get(dc, 0)
        if gpu not in gpu_ids:
            if pid == 0 and all(g.rsplit("-", 1)[0] in dcs for g in gpu_ids):
                events.append({"ph": "M", "name": "process_name", "pid": 0,
                               "args": {"name": "network"}})
            gpu_ids[gpu] = len(gpu_ids) + 1
            events.append(
                {
                    "ph": "M",
                    "name": "thread_name",
                    "pid": pid,
                    "tid": gpu_ids[gpu],
                    "args": {"name": gpu},
                }
            )
        return pid, gpu_ids[gpu]

    def us(t: float) -> float:
        return round((t - start) * 1e6, 3)

    flow = 0
    for span in spans:
        kind = span["kind"]
        args = {k: v for k, v in span.items() if k not in ("gpu", "kind", "start", "end")}
        if kind == "transfer" and span.get("src"):
            flow += 1
            pid, tid = track(span["src"])
            events.append(
                {
                    "ph": "s",
                    "id": flow,
                    "name": "tensor",
                    "cat": "transfer",
                    "pid": pid,
                    "tid": tid,
                    "ts": us(span["start"]),
                }
            )
            pid, tid = track(span["dst"])
            events.append(
                {
                    "ph": "f",
                    "bp": "e",
                    "id": flow,
                    "name": "tensor",
                    "cat": "transfer",
                    "pid": pid,
                    "tid": tid,
                    "ts": us(span["end"]),
                }
            )
            continue
        if kind not in _SHOWN:
            continue
        pid, tid = track(span["gpu"])
        events.append(
            {
                "ph": "X",
                "name": _label(span),
                "cat": kind,
                "pid": pid,
                "tid": tid,
                "ts": us(span["start"]),
                "dur": max(0.0, us(span["end"]) - us(span["start"])),
                "args": args,
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}
