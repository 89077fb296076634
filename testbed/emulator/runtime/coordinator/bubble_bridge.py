"""Bubble filling over the control channel: a worker about to wait asks for a prefill, the
shared BubbleBroker (the same one the simulator uses) decides, measured waits and
prefills teach it, and decode servers report when each KV cache arrived."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from testbed.common.spans import Span, is_wait
from testbed.emulator.runtime.wire.messages import (
    BubbleAsk,
    Idle,
    KvDelivered,
    Prefill,
    PrefillPart,
)
from testbed.inference.bubbles import BubbleBroker
from testbed.inference.workload import kv_bytes, modeled_batch_s
from testbed.job.model import Job
from testbed.policy.base import Chunk
from testbed.topology.model import Topology


@dataclass
class BubbleBridge:
    broker: BubbleBroker
    topology: Topology
    job: Job
    start: float = 0.0
    _ordered: dict[str, list[tuple[Chunk, ...]]] = field(default_factory=dict)
    """Each GPU's admitted passes not yet measured, in order."""

    def on_bubble(self, gpu: str, ask: BubbleAsk, now: float) -> Idle | Prefill:
        """A worker is about to wait: the prefill pass the bubble policy runs meanwhile."""
        workload = self.job.inference
        if workload is None:
            return Idle()
        chunks = self.broker.on_idle(gpu, ask.action, now - self.start, ask.since - self.start,
                                     ask.iteration)
        if not chunks:
            return Idle()
        self._ordered.setdefault(gpu, []).append(chunks)
        gpu_type = self.topology.gpu(gpu).type
        return Prefill([PrefillPart(c.request.id, c.request.prompt_len, c.start, c.end,
                                    kv_bytes(workload, c.request.prompt_len)) for c in chunks],
                       modeled_batch_s(workload, gpu_type, chunks))

    def learn(self, spans: Iterable[Span]) -> None:
        """Measured waits refresh the bubble predictions; measured passes the time model
        (a worker's prefill spans come in the order its passes were ordered)."""
        for span in spans:
            if is_wait(span) and span.get("action") is not None:
                self.broker.record_wait(span["gpu"], int(span["action"]), int(span["iteration"]),
                                        float(span.get("waited", span["end"] - span["start"])))
            elif span["kind"] == "prefill" and self._ordered.get(span["gpu"]):
                chunks = self._ordered[span["gpu"]].pop(0)
                self.broker.prefilled(chunks, span["end"] - span["start"])

    def on_kv(self, kv: KvDelivered) -> None:
        self.broker.delivered(kv.request, kv.at - self.start, kv.nbytes)
