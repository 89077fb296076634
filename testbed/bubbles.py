"""Filling training bubbles with prefill requests: the bookkeeping both backends share.

The backend reports when a GPU is about to wait at a receive; the broker predicts how long
(the same receive in recent iterations), asks the bubble policy which queued request (if
any) to start, and keeps score: served, rejected after their deadline, time to first
token. Pure: the backend supplies the clock."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from testbed.errors import InputError, PluginError, TestbedError
from testbed.inference import (
    PrefillModel,
    arrivals,
    dedicated_ttft,
    kv_bytes,
    modeled_prefill_s,
    percentile,
)
from testbed.job import Job
from testbed.plan.model import Plan
from testbed.policy import bubble_policy as bubble_policy_named
from testbed.policy.base import Bubble, BubblePolicy, Request
from testbed.topology import Topology

HISTORY = 3


@dataclass
class BubbleBroker:
    policy: BubblePolicy
    source: Iterator[Request]
    """Requests in arrival order; pulled as the clock reaches them."""
    prefill: PrefillModel
    deadline_s: float
    requests: list[Request] = field(default_factory=list)
    started: dict[int, tuple[str, float]] = field(default_factory=dict)
    rejected: set[int] = field(default_factory=set)
    ttft: dict[int, float] = field(default_factory=dict)
    waits: dict[tuple[str, int], list[tuple[int, float]]] = field(default_factory=dict)
    kv_bytes: int = 0
    """KV cache bytes the decode servers received."""
    _pending: Request | None = None
    _queue: list[Request] = field(default_factory=list)
    _arrival: dict[int, float] = field(default_factory=dict)

    def record_wait(self, gpu: str, action: int, iteration: int, seconds: float) -> None:
        """A measured bubble: how long `gpu` waited at `action` in `iteration`."""
        predicted = self.predicted(gpu, action)
        if predicted is not None:
            self._observe("bubble", predicted, seconds)
        history = self.waits.setdefault((gpu, action), [])
        history.append((iteration, seconds))
        del history[:-HISTORY]

    def predicted(self, gpu: str, action: int) -> float | None:
        """The shortest of the last few waits at this receive, None before any."""
        history = self.waits.get((gpu, action))
        return min(s for _, s in history) if history else None

    def queue(self, now: float) -> list[Request]:
        """Arrived, not started, not past their deadline (those are rejected here)."""
        while True:
            if self._pending is None:
                self._pending = next(self.source, None)
            if self._pending is None or self._pending.arrival > now:
                break
            self.requests.append(self._pending)
            self._queue.append(self._pending)
            self._arrival[self._pending.id] = self._pending.arrival
            self._pending = None
        keep = []
        for request in self._queue:
            if request.id in self.started:
                continue
            if now - request.arrival > self.deadline_s:
                self.rejected.add(request.id)
                continue
            keep.append(request)
        self._queue = keep
        return list(keep)

    def on_idle(self, gpu: str, action: int, now: float, since: float) -> Request | None:
        """`gpu` has waited at `action` since `since`: a request to prefill now, or None.
        The bubble is predicted to end `since` plus the usual wait at this receive."""
        queue = self.queue(now)
        if not queue:
            return None
        predicted = self.predicted(gpu, action)
        bubble = Bubble(gpu, since, since + (predicted or 0.0))
        try:
            chosen = self.policy.admit(bubble, tuple(queue), now, self.prefill)
        except TestbedError:
            raise
        except Exception as exc:
            raise PluginError(f"bubble policy {self.policy.name!r} failed in admit: "
                              f"{type(exc).__name__}: {exc}") from None
        if chosen is None:
            return None
        if chosen not in queue:
            raise PluginError(f"bubble policy {self.policy.name!r} admitted a request that "
                              "is not queued")
        self.started[chosen.id] = (gpu, now)
        return chosen

    def prefilled(self, request: Request, seconds: float) -> None:
        self._observe("prefill", self.prefill(request.prompt_len), seconds)
        self.prefill.observe(request.prompt_len, seconds)

    def _observe(self, kind: Literal["bubble", "prefill"], predicted: float,
                 actual: float) -> None:
        try:
            self.policy.observe(kind, predicted, actual)
        except TestbedError:
            raise
        except Exception as exc:
            raise PluginError(f"bubble policy {self.policy.name!r} failed in observe: "
                              f"{type(exc).__name__}: {exc}") from None

    def delivered(self, request_id: int, at: float, nbytes: int = 0) -> None:
        """The decode server has the KV cache: the first token can go out."""
        self.ttft[request_id] = at - self._arrival[request_id]
        self.kv_bytes += nbytes

    def summary(self, until: float) -> dict[str, Any]:
        self.queue(until)
        arrived = [r for r in self.requests if r.arrival <= until]
        ttfts = list(self.ttft.values())
        return {
            "requests": len(arrived),
            "served": len(self.ttft),
            "rejected": len(self.rejected),
            "pending": len(arrived) - len(self.ttft) - len(self.rejected),
            "kv_bytes": self.kv_bytes,
            "ttft_s": {"p50": percentile(ttfts, 0.5), "p99": percentile(ttfts, 0.99),
                       "mean": sum(ttfts) / len(ttfts) if ttfts else None},
            "policy": self.policy.name,
        }


def ttft_summary(values: Sequence[float]) -> dict[str, float | None]:
    return {"p50": percentile(values, 0.5), "p99": percentile(values, 0.99)}


def make_broker(topology: Topology, job: Job, plan: Plan, bubble_policy: str | None,
                options: dict[str, str] | None = None) -> BubbleBroker | None:
    """The bubble bookkeeping for a run that fills bubbles, or None."""
    if bubble_policy is None:
        return None
    if job.inference is None:
        raise InputError("a bubble policy needs an inference workload (job.inference)",
                         topology.source, "job.inference")
    gpu = topology.gpu(plan.used_gpus()[0]).type
    return BubbleBroker(bubble_policy_named(bubble_policy, options or {}),
                        arrivals(job.inference, job.seed),
                        PrefillModel.from_flops(job.inference, gpu), job.inference.deadline_s)


def inference_results(topology: Topology, job: Job, plan: Plan, broker: BubbleBroker | None,
                      until: float, dedicated_gpus: int = 1) -> dict[str, Any]:
    """The `inference` block of results.json, with the dedicated-cluster TTFT reference."""
    if broker is None or job.inference is None:
        return {"requests": 0, "served": 0, "rejected": 0, "ttft_s": {"p50": None, "p99": None}}
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
