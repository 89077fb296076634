"""Inference in pipeline bubbles: when a worker is about to wait, the bubble policy may
start a prefill on its GPU; the KV cache then goes to the decode server over the same
network model as training traffic."""

from __future__ import annotations

import functools
import itertools

from testbed.common.span_table import SpanTable
from testbed.inference.bubbles import BubbleBroker
from testbed.inference.workload import kv_bytes, modeled_batch_s
from testbed.job.model import InferenceWorkload
from testbed.plan.jitter import Noise
from testbed.policy.base import Chunk, Request
from testbed.sim.flows import pair_between
from testbed.sim.links import Links
from testbed.sim.network import FluidNetwork, Pair, Schedule
from testbed.sim.workers import Resume, SimWorker
from testbed.topology.model import Topology


class Prefills:
    def __init__(self, topology: Topology, workload: InferenceWorkload, broker: BubbleBroker,
                 network: FluidNetwork, links: Links, at: Schedule, spans: SpanTable,
                 noise: Noise) -> None:
        self.topology, self.workload, self.broker = topology, workload, broker
        self.network, self.links, self.at, self.spans = network, links, at, spans
        self.noise = noise
        self._decode_pairs: dict[str, Pair] = {}

    def fill(self, worker: SimWorker, now: float, resume: Resume) -> None:
        """The GPU is about to wait: let the bubble policy start a prefill pass.
        `resume(worker, t)` carries on with the worker's steps when a pass outlasts its
        wait (passed per call, so that the simulator and this do not hold each other)."""
        chunks = self.broker.on_idle(worker.lead, worker.pc, now, worker.waiting_since,
                                     worker.iteration)
        if not chunks:
            return
        gpu = self.topology.gpu(worker.lead).type
        duration = modeled_batch_s(self.workload, gpu, chunks) * self.noise.factor("prefill")
        worker.prefill_started, worker.prefill_until = now, now + duration
        worker.record(self.spans, "prefill", now, now + duration,
                      requests=[c.request.id for c in chunks],
                      tokens=sum(c.tokens for c in chunks))
        self.at(now + duration, functools.partial(self._prefilled, worker, chunks, resume))

    def _prefilled(self, worker: SimWorker, chunks: tuple[Chunk, ...], resume: Resume,
                   now: float) -> None:
        self.broker.prefilled(chunks, now - worker.prefill_started)
        worker.prefill_until = 0.0
        for chunk in chunks:
            if chunk.last:
                self._ship_kv(worker, chunk.request, now)
        if worker.resume_after_prefill:
            worker.resume_after_prefill = False
            resume(worker, now)
        else:
            self.fill(worker, now, resume)  # still waiting: maybe another one fits

    def _decode_dc(self, dc: str) -> str:
        """Where a prefill's KV cache goes: the named DC, or the prefill's own DC."""
        named = self.workload.decode_dc
        return named if named and named != "local" else dc

    def _ship_kv(self, worker: SimWorker, request: Request, now: float) -> None:
        nbytes = kv_bytes(self.workload, request.prompt_len)
        decode = self._decode_dc(worker.dc)
        hops = self.topology.path(worker.dc, decode)
        wan = tuple(f"wan:{a}>{b}" for a, b in itertools.pairwise(hops))
        latency = self.links.one_way(worker.dc, decode) + self.topology.dc(decode).latency_s
        pair = self._decode_pairs.get(worker.lead)
        if pair is None:
            pair = self._decode_pairs[worker.lead] = pair_between(
                self.topology, worker.dc, decode, 1, 2 * latency, 0.0)
        pair.set_loss(self.links.path_loss(worker.dc, decode))

        def delivered(t: float, started: float = now) -> None:
            self.broker.delivered(request.id, t, nbytes)
            self.spans.add(worker.alone, "kv_transfer", started, t, worker.iteration,
                           {"bytes": nbytes, "request": request.id, "stage": worker.stage,
                            "link": None if worker.dc == decode else f"{worker.dc}>{decode}"})

        self.network.start(
            now,
            nbytes,
            (f"up:{worker.lead}", *wan, f"down:decode-{decode}"),
            pair,
            latency,
            delivered,
        )
