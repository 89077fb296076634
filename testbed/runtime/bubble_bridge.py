"""Bubble filling over the control channel: a worker about to wait asks for a prefill, the
shared BubbleBroker (the same one the simulator uses) decides, measured waits and
prefills teach it, and decode servers report when each KV cache arrived."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from testbed.bubbles import BubbleBroker
from testbed.inference import kv_bytes, modeled_prefill_s
from testbed.job import Job
from testbed.policy.base import Request
from testbed.runtime.messages import BubbleAsk, Idle, KvDelivered, Prefill
from testbed.spans import Span
from testbed.topology.model import Topology


@dataclass
class BubbleBridge:
    broker: BubbleBroker
    topology: Topology
    job: Job
    start: float = 0.0
    _admitted: dict[int, Request] = field(default_factory=dict)

    def on_bubble(self, gpu: str, ask: BubbleAsk, now: float) -> Idle | Prefill:
        """A worker is about to wait: the prefill the bubble policy runs meanwhile."""
        workload = self.job.inference
        if workload is None:
            return Idle()
        request = self.broker.on_idle(gpu, ask.action, now - self.start, ask.since - self.start)
        if request is None:
            return Idle()
        self._admitted[request.id] = request
        gpu_type = self.topology.gpu(gpu).type
        return Prefill(request.id, request.prompt_len,
                       modeled_prefill_s(workload, gpu_type, request.prompt_len),
                       kv_bytes(workload, request.prompt_len))

    def learn(self, spans: Iterable[Span]) -> None:
        """Measured waits refresh the bubble predictions; measured prefills the time model."""
        for span in spans:
            if span["kind"] == "recv" and span.get("action") is not None:
                self.broker.record_wait(span["gpu"], int(span["action"]), int(span["iteration"]),
                                        float(span.get("waited", span["end"] - span["start"])))
            elif span["kind"] == "prefill" and span.get("request") in self._admitted:
                self.broker.prefilled(self._admitted[span["request"]],
                                      span["end"] - span["start"])

    def on_kv(self, kv: KvDelivered) -> None:
        self.broker.delivered(kv.request, kv.at - self.start, kv.nbytes)
