"""Filling training bubbles with prefill requests: the bookkeeping both backends share.

The backend reports when a GPU is about to wait (at a receive or an all-reduce); the
broker predicts how long (the same wait in recent iterations of the same program, or the
plan's modeled wait before any was measured), asks the bubble policy what to prefill
meanwhile (whole prompts, batched, or chunks of a long one whose KV cache stays on that
GPU), and keeps score: served, rejected after their deadline, time to first token. Pure:
the backend supplies the clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NotRequired, TypedDict

from testbed.common.stats import percentile
from testbed.errors import InputError, PluginError
from testbed.inference.waiting import OfferedQueue, WaitingRequests
from testbed.inference.workload import (
    PrefillModel,
    WaitKey,
    arrivals,
    dedicated_ttft,
    kv_bytes,
    modeled_prefill_s,
    wait_key,
)
from testbed.job.model import Job
from testbed.plan.model import Plan
from testbed.policy import bubble_policy as bubble_policy_named
from testbed.policy.base import Bubble, BubblePolicy, Chunk, Request
from testbed.policy.guard import plugin_code
from testbed.topology import Topology

HISTORY = 3



@dataclass
class BubbleBroker:
    policy: BubblePolicy
    source: Iterator[Request]
    """Requests in arrival order; pulled as the clock reaches them."""
    prefill: PrefillModel
    deadline_s: float
    max_batch_tokens: int = 8192
    modeled_waits: Mapping[WaitKey, float] = field(default_factory=dict)
    """The plan's waits as the simulator models them: predictions until one is measured."""
    program_of: Callable[[int], int] = field(default=lambda _iteration: 0, repr=False)
    """The program each iteration runs (Plan.program_of), so that one program's waits
    never predict another's."""
    requests: list[Request] = field(default_factory=list)
    started: dict[int, tuple[str, float]] = field(default_factory=dict)
    """Request id: the GPU and time its (first chunk's) prefill started."""
    rejected: set[int] = field(default_factory=set)
    ttft: dict[int, float] = field(default_factory=dict)
    waits: dict[WaitKey, list[tuple[int, float]]] = field(default_factory=dict)
    kv_bytes: int = 0
    """KV cache bytes the decode servers received."""
    chunked: int = 0
    """Requests prefilled in more than one chunk."""
    batches: int = 0
    """Passes that prefilled more than one request."""
    _partial: dict[int, Request] = field(default_factory=dict)
    """Requests chunked so far, with `prefilled` up to their last admitted chunk."""
    _pending: Request | None = None
    _queue: WaitingRequests = field(default_factory=WaitingRequests)
    """Arrived, not started, not expired, oldest first."""
    _arrival: dict[int, float] = field(default_factory=dict)
    _warm_up: int | None = None
    """The run's first iteration, whose waits are long as connections warm up."""

    def record_wait(self, gpu: str, action: int, iteration: int, seconds: float) -> None:
        """A measured bubble: how long `gpu` waited at `action` in `iteration`."""
        if self._warm_up is None:
            self._warm_up = iteration
        program = self.program_of(iteration)
        predicted = self.predicted(gpu, action, program)
        if predicted is not None:
            self._observe("bubble", predicted, seconds)
        history = self.waits.setdefault(wait_key(gpu, action, program), [])
        history.append((iteration, seconds))
        del history[:-HISTORY]

    def predicted(self, gpu: str, action: int, program: int = 0, elapsed: float = 0.0
                  ) -> float | None:
        """How long the wait at this action of this program lasts: the median of the last
        three waits there, the shortest while fewer are known (with the modeled one
        counted until two were measured); None when there is none. Of a wait that has
        lasted `elapsed` so far, only the waits seen there that were longer count.

        The run's first iteration's waits are long, as connections warm up: where the
        modeled one is known they never count, or a wait the model puts near zero, once
        it has lasted a moment, would be predicted as long as the warm-up's and filled
        past its end.

        The median, not the shortest: under noise the shortest of three is about a
        quarter of the way up the waits' spread, and every bubble longer than that was
        left unfilled past it, a quarter of bubble time at 10% jitter; the policy's guard
        is for the misses."""
        key = wait_key(gpu, action, program)
        modeled = self.modeled_waits.get(key)
        waits = [s for i, s in self.waits.get(key, [])
                 if modeled is None or i != self._warm_up]
        if modeled is not None and len(waits) < 2:
            waits.append(modeled)
        longer = sorted(w for w in waits if w > elapsed)
        if not longer:
            return None
        return longer[len(longer) // 2] if len(longer) >= HISTORY else longer[0]

    def catch_up(self, now: float) -> None:
        """The queue as of `now`: arrived, not started, not past their deadline (those are
        rejected here), in arrival order. Amortized: arrivals join at the back, the expired
        leave from the front, and a request leaves when it starts."""
        while True:
            if self._pending is None:
                self._pending = next(self.source, None)
            if self._pending is None or self._pending.arrival > now:
                break
            request, self._pending = self._pending, None
            self.requests.append(request)
            self._queue.append(request)
            self._arrival[request.id] = request.arrival
        while (oldest := self._queue.oldest()) is not None \
                and now - oldest.arrival > self.deadline_s:
            self._queue.remove(oldest.id)
            self.rejected.add(oldest.id)

    def on_idle(self, gpu: str, action: int, now: float, since: float, iteration: int = 0
                ) -> tuple[Chunk, ...]:
        """`gpu` has waited at `action` of `iteration` since `since`: what to prefill now,
        in one pass (empty for nothing). The bubble is predicted to end `since` plus the
        usual wait there. The policy sees the requests chunked on this GPU first, then the
        queue oldest first."""
        mine = [r for r in self._partial.values() if self.started[r.id][0] == gpu]
        self.catch_up(now)
        queue = OfferedQueue(mine, self._queue)  # no copy: the queue runs to thousands
        if not queue:
            return ()
        predicted = self.predicted(gpu, action, self.program_of(iteration), now - since)
        bubble = Bubble(gpu, since, since + (predicted or 0.0))
        with plugin_code(f"bubble policy {self.policy.name!r} failed in admit",
                         type(self.policy).__module__):
            chunks = tuple(self.policy.admit_batch(bubble, queue, now, self.prefill,
                                                   self.max_batch_tokens))
        self._check(chunks, gpu)
        for chunk in chunks:
            request = chunk.request
            if self._queue.get(request.id) is not None:
                self._queue.remove(request.id)
            self.started.setdefault(request.id, (gpu, now))
            if chunk.last:
                if request.id in self._partial:
                    self.chunked += 1
                self._partial.pop(request.id, None)
            else:
                self._partial[request.id] = dataclasses.replace(request, prefilled=chunk.end)
        self.batches += len(chunks) > 1
        return chunks

    def _offered(self, request: Request, gpu: str) -> bool:
        """Whether `request`, as the policy returned it, is one offered to `gpu`."""
        if request.prefilled:
            return self._partial.get(request.id) == request \
                and self.started[request.id][0] == gpu
        return self._queue.get(request.id) == request

    def _check(self, chunks: Sequence[Chunk], gpu: str) -> None:
        """A policy's answer within the contract of `BubblePolicy.admit_batch`."""
        ids = [c.request.id for c in chunks]
        problem = None
        if chunks and not self.policy.fills:
            problem = "a prefill, though it declares it never fills (fills = False)"
        elif len(set(ids)) != len(ids):
            problem = "the same request twice in one pass"
        elif not all(self._offered(c.request, gpu) for c in chunks):
            problem = "a request that is not queued for this GPU"
        elif any(not c.request.prefilled == c.start < c.end <= c.request.prompt_len
                 for c in chunks):
            problem = "a chunk that does not start where its request's prefill stands"
        elif sum(c.tokens for c in chunks) > self.max_batch_tokens:
            problem = f"more than max_batch_tokens ({self.max_batch_tokens}) in one pass"
        if problem:
            raise PluginError(f"bubble policy {self.policy.name!r} admitted {problem}")

    def prefilled(self, chunks: Sequence[Chunk], seconds: float) -> None:
        """A pass of `chunks` took `seconds`: teach the prefill model and the policy."""
        self._observe("prefill", self.prefill.batch(chunks), seconds)
        self.prefill.observe_batch(chunks, seconds)

    def _observe(self, kind: Literal["bubble", "prefill"], predicted: float,
                 actual: float) -> None:
        with plugin_code(f"bubble policy {self.policy.name!r} failed in observe",
                         type(self.policy).__module__):
            self.policy.observe(kind, predicted, actual)

    def delivered(self, request_id: int, at: float, nbytes: int = 0) -> None:
        """The decode server has the KV cache: the first token can go out."""
        self.ttft[request_id] = at - self._arrival[request_id]
        self.kv_bytes += nbytes

    def summary(self, until: float) -> InferenceSummary:
        """Every arrival counted once: served (its first token went out; `expired`: of
        those, the ones whose first token came after the deadline), rejected (not started
        within the deadline), or pending when the run ended (queued, or part-way)."""
        self.catch_up(until)
        arrived = [r for r in self.requests if r.arrival <= until]
        ttfts = list(self.ttft.values())
        return {
            "requests": len(arrived),
            "served": len(self.ttft),
            "served_share": len(self.ttft) / len(arrived) if arrived else None,
            "expired": sum(t > self.deadline_s for t in ttfts),
            "rejected": len(self.rejected),
            "pending": len(arrived) - len(self.ttft) - len(self.rejected),
            "chunked": self.chunked,
            "batched_passes": self.batches,
            "kv_bytes": self.kv_bytes,
            "ttft_s": {"p50": percentile(ttfts, 0.5), "p99": percentile(ttfts, 0.99),
                       "mean": sum(ttfts) / len(ttfts) if ttfts else None},
            "policy": self.policy.name,
        }


    def request_rows(self, until: float) -> list[RequestRow]:
        """One row per request arrived by `until`, in arrival order (requests.csv)."""
        self.catch_up(until)
        rows: list[RequestRow] = []
        for request in self.requests:
            if request.arrival > until:
                break
            gpu, start = self.started.get(request.id, (None, None))
            ttft = self.ttft.get(request.id)
            rows.append(RequestRow(
                id=request.id, arrival_s=request.arrival, prompt_tokens=request.prompt_len,
                start_s=start, gpu=gpu, ttft_s=ttft, status=request_status(
                    ttft, request.id in self.rejected, self.deadline_s)))
        return rows


RequestStatus = Literal["served", "expired", "rejected", "pending"]


class RequestRow(TypedDict):
    """One inference request's fate (a line of a run's requests.csv)."""

    id: int
    arrival_s: float
    prompt_tokens: int
    start_s: float | None
    """When its (first chunk's) prefill started; None when it never did."""
    gpu: str | None
    ttft_s: float | None
    """Arrival to the decode server's receipt of its KV cache; None unless served."""
    status: RequestStatus


def request_status(ttft_s: float | None, rejected: bool, deadline_s: float
                   ) -> RequestStatus:
    """served: first token within the deadline; expired: after it; rejected: not started
    within it; pending: the run ended first."""
    if ttft_s is not None:
        return "served" if ttft_s <= deadline_s else "expired"
    return "rejected" if rejected else "pending"


class TtftSummary(TypedDict):
    """Time to first token (seconds) over served requests."""

    p50: float | None
    p99: float | None
    mean: NotRequired[float | None]


class DedicatedSummary(TypedDict):
    """The reference: the same requests on GPUs of their own."""

    gpus: int
    ttft_s: TtftSummary


class InferenceSummary(TypedDict):
    """The `inference` block of results.json as the bubble bookkeeping makes it (the
    backends add the overruns; testbed.report.run_results.Inference is its type there)."""

    requests: int
    served: int
    expired: int
    rejected: int
    ttft_s: TtftSummary
    served_share: NotRequired[float | None]
    pending: NotRequired[int]
    chunked: NotRequired[int]
    batched_passes: NotRequired[int]
    kv_bytes: NotRequired[int]
    policy: NotRequired[str]
    dedicated: NotRequired[DedicatedSummary]


def ttft_summary(values: Sequence[float]) -> TtftSummary:
    return {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99)}


def make_broker(topology: Topology, job: Job, plan: Plan, bubble_policy: str | None,
                options: dict[str, str] | None = None,
                modeled_waits: Mapping[WaitKey, float] | None = None) -> BubbleBroker | None:
    """The bubble bookkeeping for a run that fills bubbles, or None. `modeled_waits`: the
    plan's waits as modeled (testbed.sim.bubble_seed), so the first iteration is filled."""
    if bubble_policy is None:
        return None
    if job.inference is None:
        raise InputError("a bubble policy needs an inference workload (job.inference)",
                         topology.source, "job.inference")
    gpu = topology.gpu(plan.used_gpus()[0]).type
    return BubbleBroker(bubble_policy_named(bubble_policy, options or {}),
                        arrivals(job.inference, job.seed),
                        PrefillModel.from_flops(job.inference, gpu), job.inference.deadline_s,
                        job.inference.max_batch_tokens, dict(modeled_waits or {}),
                        plan.program_of)


def inference_results(topology: Topology, job: Job, plan: Plan, broker: BubbleBroker | None,
                      until: float, dedicated_gpus: int = 1) -> InferenceSummary:
    """The `inference` block of results.json, with the dedicated-cluster TTFT reference."""
    if broker is None or job.inference is None:
        return {"requests": 0, "served": 0, "expired": 0, "rejected": 0,
                "ttft_s": {"p50": None, "p99": None}}
    out = broker.summary(until)
    workload = job.inference
    named = workload.decode_dc if workload.decode_dc not in (None, "local") else None
    decode = named or topology.dc_of(plan.used_gpus()[0])
    gpu = topology.gpu(plan.used_gpus()[0]).type
    reference = dedicated_ttft(
        [r for r in broker.requests if r.arrival <= until], dedicated_gpus,
        lambda n: modeled_prefill_s(workload, gpu, n),
        lambda n: kv_bytes(workload, n) * 8 / topology.dc(decode).bandwidth_bps)
    out["dedicated"] = {"gpus": dedicated_gpus, "ttft_s": ttft_summary(reference)}
    return out
