"""Time dilation: run an emulation K times slower than the time it represents.

As in time-dilated network emulators (Gupta et al., "To Infinity and Beyond: Time-Warped
Network Emulation", NSDI 2006; DieCast, NSDI 2008): link rates are divided by K and every
duration (latency, jitter, compute, events, timeouts, TCP's minimum RTO) multiplied by K,
so bytes, windows and bandwidth-delay products stay what they represent and TCP behaves
as on the represented network, while this machine has K times longer to move each byte.
Measured times are divided by K on the way back. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from testbed.common.spans import Span
from testbed.job.model import Job
from testbed.topology.model import Datacenter, TcpSettings, Topology, WanLink
from testbed.topology.net_events import NetEvent

if TYPE_CHECKING:
    from testbed.inference.bubbles import InferenceSummary, RequestRow, TtftSummary

LINUX_RTO_MIN_S = 0.2
"""TCP_RTO_MIN: the floor of the retransmission timeout, set per namespace when dilated."""
MAX_DILATION = 64


def dilate_tcp(tcp: TcpSettings, k: float) -> TcpSettings:
    return dataclasses.replace(tcp, rto_min_s=(tcp.rto_min_s or LINUX_RTO_MIN_S) * k)


def dilate_dc(dc: Datacenter, k: float) -> Datacenter:
    """A GPU K times slower stretches every modeled compute and prefill time K-fold."""
    return dataclasses.replace(dc, bandwidth_bps=dc.bandwidth_bps / k, latency_s=dc.latency_s * k,
                               gpu=dataclasses.replace(dc.gpu, peak_flops=dc.gpu.peak_flops / k),
                               tcp=None if dc.tcp is None else dilate_tcp(dc.tcp, k))


def dilate_link(link: WanLink, k: float) -> WanLink:
    """Queue bytes stay: at 1/K of the rate they hold K times the queueing delay."""
    return dataclasses.replace(link, bandwidth_bps=link.bandwidth_bps / k,
                               latency_s=link.latency_s * k, jitter_s=link.jitter_s * k)


def dilate_topology(topology: Topology, k: float) -> Topology:
    if k == 1:
        return topology
    return dataclasses.replace(
        topology, datacenters=tuple(dilate_dc(dc, k) for dc in topology.datacenters),
        links=tuple(dilate_link(link, k) for link in topology.links),
        tcp=dilate_tcp(topology.tcp, k))


def dilate_event(event: NetEvent, k: float) -> NetEvent:
    value = {"latency": event.value * k, "bandwidth": event.value / k}.get(event.kind,
                                                                          event.value)
    return dataclasses.replace(event, at_s=event.at_s * k, value=value,
                               for_s=None if event.for_s is None else event.for_s * k)


def dilate_events(events: Iterable[NetEvent], k: float) -> tuple[NetEvent, ...]:
    return tuple(dilate_event(e, k) for e in events)


def dilate_job(job: Job, k: float) -> Job:
    """A measured compute time K times longer (as the GPUs' peak is K times lower),
    inference arrivals K times sparser and deadlines K times longer."""
    if k == 1:
        return job
    measured = job.compute_time
    if measured is not None:
        job = dataclasses.replace(job, compute_time=dataclasses.replace(
            measured, seconds=measured.seconds * k))
    workload = job.inference
    if workload is None:
        return job
    trace = None if workload.trace is None else tuple((t * k, n) for t, n in workload.trace)
    return dataclasses.replace(job, inference=dataclasses.replace(
        workload, arrival_rate=workload.arrival_rate / k, deadline_s=workload.deadline_s * k,
        trace=trace))


def represented_spans(spans: Iterable[Span], start: float, k: float) -> list[Span]:
    """Spans on the represented clock: offsets from `start` divided by K."""
    if k == 1:
        return list(spans)
    out = []
    for span in spans:
        copy = span.copy()
        copy["start"] = start + (span["start"] - start) / k
        copy["end"] = start + (span["end"] - start) / k
        if isinstance(span.get("waited"), int | float):
            copy["waited"] = span["waited"] / k
        out.append(copy)
    return out


def represented_inference(block: InferenceSummary, k: float) -> InferenceSummary:
    """An inference results block with its latencies (every `ttft_s`) divided by K."""
    out: InferenceSummary = {**block, "ttft_s": _represented_ttft(block["ttft_s"], k)}
    if "dedicated" in block:
        dedicated = block["dedicated"]
        out["dedicated"] = {"gpus": dedicated["gpus"],
                            "ttft_s": _represented_ttft(dedicated["ttft_s"], k)}
    return out


def _represented_ttft(ttft: TtftSummary, k: float) -> TtftSummary:
    def divided(value: float | None) -> float | None:
        return None if value is None else value / k

    out: TtftSummary = {"p50": divided(ttft["p50"]), "p99": divided(ttft["p99"])}
    if "mean" in ttft:
        out["mean"] = divided(ttft["mean"])
    return out


def represented_requests(rows: Iterable[RequestRow], k: float) -> list[RequestRow]:
    """Per-request rows with their times (seconds since the run started) divided by K."""
    out: list[RequestRow] = []
    for row in rows:
        start, ttft = row["start_s"], row["ttft_s"]
        out.append({**row, "arrival_s": row["arrival_s"] / k,
                    "start_s": None if start is None else start / k,
                    "ttft_s": None if ttft is None else ttft / k})
    return out


def peak_rate_bps(spans: Iterable[Span], wan_only: bool = True) -> float:
    """The most bits per second a plan's transfers move at once (a sweep over simulated
    transfer spans): what the emulator's forwarding must keep up with."""
    edges: list[tuple[float, float]] = []
    for span in spans:
        if span.get("kind") != "transfer" or span.get("modeled"):
            continue
        if wan_only and span.get("link") is None:
            continue
        length = span["end"] - span["start"]
        if length <= 0 or not span.get("bytes"):
            continue
        rate = span["bytes"] * 8 / length
        edges += [(span["start"], rate), (span["end"], -rate)]
    peak = current = 0.0
    for _, delta in sorted(edges, key=lambda e: (e[0], e[1])):
        current += delta
        peak = max(peak, current)
    return peak


@dataclass(frozen=True)
class WorkerCosts:
    """What this machine's CPU pays for the workers besides the bytes they move
    (measured by testbed.emulator.runtime.coordinator.calibrate)."""

    span_cpu_s: float
    """CPU seconds per span a worker records: the action behind it (a send, a receive, a
    compute handed to the compute thread, a ring step) and the span's trip to the
    coordinator."""
    idle_cpu: float
    """CPU seconds per second a worker uses doing nothing (its event loop's upkeep)."""


PATH_LIMIT = 0.02
"""The share of a worker's time its own actions' CPU may take (at dilation K, a K-th of
what it takes undilated). Each action's CPU lies on the worker's path from one message to
the next, so the iteration stretches by about that share, more where its path crosses
several workers: two-dc's pipelines at K=1, whose busiest worker spent 5-11% of the
iteration on its actions, ran 1.2-1.7 times that much slower than the simulator
(`benchmarks/fidelity.json`). Kept under 2%, the stretch stays within the 5% the emulator
and the simulator are held to."""


@dataclass(frozen=True)
class MachineLoad:
    """What a plan asks of this machine at dilation 1, as shares of all its cores: bytes
    to forward (the plan's peak rate over what the machine forwards), the workers'
    bookkeeping (the plan's spans per represented second times their CPU), both of which
    shrink K-fold at dilation K, and the workers' upkeep, which does not; and, per worker,
    the share of its own time its actions take (`path`), which lengthens its path
    however idle the other cores are, and shrinks K-fold too."""

    peak_bps: float
    capacity_bps: float
    spans_per_s: float
    workers: int
    cores: int
    costs: WorkerCosts
    busiest_spans_per_s: float = 0.0
    """The spans per represented second of the worker with the most
    (`busiest_spans_per_second`)."""

    @property
    def forwarding(self) -> float:
        return self.peak_bps / self.capacity_bps if self.capacity_bps > 0 else 0.0

    @property
    def bookkeeping(self) -> float:
        return self.spans_per_s * self.costs.span_cpu_s / self.cores

    @property
    def upkeep(self) -> float:
        return self.workers * self.costs.idle_cpu / self.cores

    @property
    def path(self) -> float:
        return self.busiest_spans_per_s * self.costs.span_cpu_s


def _spans_by_worker(spans: Iterable[Span]) -> tuple[dict[str, int], float]:
    """Each worker's spans of a simulated run of the plan (the emulator's workers record
    the same spans), network events left out, and the run's length."""
    starts, ends = math.inf, -math.inf
    counts: dict[str, int] = {}
    for span in spans:
        if span.get("kind") == "net_event":
            continue
        counts[span["gpu"]] = counts.get(span["gpu"], 0) + 1
        starts, ends = min(starts, span["start"]), max(ends, span["end"])
    return counts, (ends - starts if counts else 0.0)


def spans_per_second(spans: Iterable[Span]) -> float:
    """The workers' spans per second, all of them together."""
    counts, length = _spans_by_worker(spans)
    return sum(counts.values()) / length if length > 0 else 0.0


def busiest_spans_per_second(spans: Iterable[Span]) -> float:
    """The spans per second of the worker that records the most, over the run's length."""
    counts, length = _spans_by_worker(spans)
    return max(counts.values()) / length if length > 0 else 0.0


def choose_dilation(peak_bps: float, capacity_bps: float, usable: float = 0.5,
                    bookkeeping: float = 0.0, upkeep: float = 0.0, path: float = 0.0) -> int:
    """The smallest K at which what the plan asks of this machine fits a share of it:
    (forwarding + bookkeeping) / K + upkeep <= usable, the forwarding share being the
    plan's peak rate over what the machine forwards (MachineLoad); `usable` leaves the
    rest of the cores to everything else. And at which its busiest worker's actions take
    at most PATH_LIMIT of that worker's time: path / K <= PATH_LIMIT."""
    forwarding = peak_bps / capacity_bps if peak_bps > 0 and capacity_bps > 0 else 0.0
    need = forwarding + bookkeeping
    own = math.ceil(path / PATH_LIMIT - 1e-9) if path > 0 else 1
    if need <= 0:
        return max(1, min(MAX_DILATION, own))
    spare = usable - upkeep
    if spare <= 0:
        return MAX_DILATION
    return max(1, min(MAX_DILATION, max(own, math.ceil(need / spare - 1e-9))))


def choose_for(load: MachineLoad, usable: float = 0.5) -> int:
    return choose_dilation(load.peak_bps, load.capacity_bps, usable, load.bookkeeping,
                           load.upkeep, load.path)


MIN_USABLE = 0.2
"""However busy the rest of the machine: the scheduler shares the cores among runnable
processes, so a run gets its share of a machine others keep busy (and planning on less
stretched a 64-GPU run on this 2-core machine to dilation 64, over half an hour)."""


def usable_share(background: float, kept: float = 0.5) -> float:
    """The share of the machine a run may plan on: half of what the rest of the machine's
    work (`background`, its busy share before the run) leaves, and at least MIN_USABLE."""
    return max(MIN_USABLE, kept * (1.0 - min(1.0, max(0.0, background))))
