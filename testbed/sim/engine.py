"""Discrete-event simulation of a Plan: the same action lists, arbiter and policy hooks as
the emulator, with modeled compute and a flow-level network. Writes the same spans, so
metrics and reports cannot tell the backends apart."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.bubbles import BubbleBroker
from testbed.compute import StageCost, ring_allreduce_s, stage_cost
from testbed.events import Change, NetEvent, changes, event_spans
from testbed.inference import kv_bytes, modeled_prefill_s
from testbed.job import Job
from testbed.pacing import GRADIENTS, paced
from testbed.plan.model import Op, Plan, Sharing
from testbed.policy.arbiter import Arbiter
from testbed.policy.base import Request, TrainingPolicy, Transfer
from testbed.sim.network import (
    RTO_MIN,
    WINDOW_EFFICIENCY,
    EventQueue,
    FluidNetwork,
    Pair,
    resume_after_outage,
)
from testbed.topology.model import Topology


@dataclass
class _Worker:
    index: int
    replica: int
    stage: int
    gpus: tuple[str, ...]
    dc: str
    actions: tuple[Any, ...]
    pc: int = 0
    iteration: int = 0
    done: bool = False
    waiting_since: float = 0.0
    prefill_started: float = 0.0
    prefill_until: float = 0.0
    resume_after_prefill: bool = False

    @property
    def lead(self) -> str:
        return self.gpus[0]


@dataclass
class _Ring:
    """One stage's all-reduce in progress."""

    arrived: dict[int, float] = field(default_factory=dict)
    step: int = 0
    landed: int = 0


@dataclass
class SimResult:
    spans: list[dict[str, Any]]
    start: float
    events: int


def stage_costs(
    topology: Topology,
    job: Job,
    plan: Plan,
    profile: Mapping[int, Mapping[str, float]] | None = None,
) -> list[StageCost]:
    """Per-stage compute: the FLOP model on the stage's GPU type, or a measured profile."""
    costs = []
    for stage in range(plan.pp):
        gpu = topology.gpu(plan.lead_gpu(0, stage)).type
        cost = stage_cost(job, plan.layers[stage], stage == 0, stage == plan.pp - 1, gpu, plan.tp)
        if profile is not None and stage in profile:
            measured = profile[stage]
            cost = StageCost(
                measured.get("forward_s", cost.forward_s),
                measured.get("backward_s", cost.backward_s),
                cost.grad_bytes,
            )
        costs.append(cost)
    return costs


class Simulator:
    def __init__(
        self,
        topology: Topology,
        job: Job,
        plan: Plan,
        policy: TrainingPolicy,
        profile: Mapping[int, Mapping[str, float]] | None = None,
        step_s: float = 0.0,
        bubbles: BubbleBroker | None = None,
        events: Sequence[NetEvent] = (),
    ) -> None:
        self.topology, self.job, self.plan, self.policy = topology, job, plan, policy
        self.events = tuple(events)
        self.bubbles = bubbles
        self.costs = stage_costs(topology, job, plan, profile)
        self.step_s = step_s
        self.queue = EventQueue()
        self.spans: list[dict[str, Any]] = []
        self.arbiter = Arbiter(policy, plan)
        self.workers: dict[tuple[int, int], _Worker] = {}
        for index, ((replica, stage), gpus) in enumerate(plan.workers()):
            self.workers[(replica, stage)] = _Worker(
                index, replica, stage, gpus, topology.dc_of(gpus[0]), plan.actions[gpus[0]]
            )
        self.network = FluidNetwork(self._capacities(), self.queue.at)
        self.pairs: dict[tuple[str, str], Pair] = {}
        self.mailbox: set[tuple[str, int, int, int, int]] = set()
        self.waiting: dict[tuple[str, int, int, int, int], _Worker] = {}
        self.rings: dict[tuple[int, int], _Ring] = {}
        self._starters: dict[int, Any] = {}
        self._decode_pairs: dict[str, Pair] = {}
        self._pair_queue: dict[int, list[Any]] = {}
        self._transfer_ids = 0
        self._latency = {_link_key(link.a, link.b): link.latency_s for link in topology.links}
        self._bandwidth = {_link_key(link.a, link.b): link.bandwidth_bps for link in topology.links}
        self._down_since: dict[tuple[str, str], float] = {}
        self._loss = {_link_key(link.a, link.b): link.loss for link in topology.links}
        for change in changes(self.events, topology):
            self.queue.at(change.at_s, functools.partial(self._apply, change))

    # --- network ---------------------------------------------------------------------

    def _capacities(self) -> dict[str, float]:
        capacity: dict[str, float] = {}
        for link in self.topology.links:
            capacity[f"wan:{link.a}>{link.b}"] = link.bandwidth_bps
            capacity[f"wan:{link.b}>{link.a}"] = link.bandwidth_bps
        for worker in self.workers.values():
            nic = self.topology.dc(worker.dc).bandwidth_bps * len(worker.gpus)
            capacity[f"up:{worker.lead}"] = nic
            capacity[f"down:{worker.lead}"] = nic
        for dc in self.topology.datacenters:
            capacity[f"down:decode-{dc.name}"] = dc.bandwidth_bps
        return capacity

    def _one_way(self, src_dc: str, dst_dc: str) -> float:
        """Propagation delay along the route set up at the start, with event changes."""
        hops = self.topology.path(src_dc, dst_dc)
        return sum(self._latency[_link_key(a, b)] for a, b in itertools.pairwise(hops))

    def _apply(self, change: Change, now: float) -> None:
        """A network event: latency for transfers that start from now on, bandwidth at
        once, an outage stops the link and TCP resumes after its retransmission backoff.
        Loss alone is not modeled (BBR, the default, keeps its rate under light loss)."""
        key = _link_key(change.a, change.b)
        resources = (f"wan:{change.a}>{change.b}", f"wan:{change.b}>{change.a}")
        if change.latency_s is not None:
            self._latency[key] = change.latency_s
        if change.bandwidth_bps is not None:
            self._bandwidth[key] = change.bandwidth_bps
            if key not in self._down_since:
                for resource in resources:
                    self.network.set_capacity(now, resource, change.bandwidth_bps)
        if change.loss is None:
            return
        self._loss[key] = change.loss
        if change.loss >= 1.0 and key not in self._down_since:  # the link goes down
            self._down_since[key] = now
            for resource in resources:
                self.network.set_capacity(now, resource, 0.0)
        elif change.loss < 1.0 and key in self._down_since:  # and comes back
            outage = now - self._down_since[key]
            rto = (self.topology.tcp_for(key[0]).rto_min_s or RTO_MIN) + 2 * self._latency[key]
            back = self._down_since[key] + resume_after_outage(outage, rto)
            self.queue.at(back, functools.partial(self._link_back, key, resources))

    def _link_back(self, key: tuple[str, str], resources: tuple[str, ...], now: float) -> None:
        if self._loss[key] >= 1.0:
            return  # down again before TCP came back: the next restore brings it back
        self._down_since.pop(key, None)
        for resource in resources:
            self.network.set_capacity(now, resource, self._bandwidth[key])
            self.network.restart_windows(now, resource)

    def _decode_dc(self, dc: str) -> str:
        """Where a prefill's KV cache goes: the named DC, or the prefill's own DC."""
        named = self.job.inference.decode_dc if self.job.inference else None
        return named if named and named != "local" else dc

    def _path(self, src: _Worker, dst: _Worker) -> tuple[tuple[str, ...], float]:
        hops = self.topology.path(src.dc, dst.dc)
        wan = [f"wan:{a}>{b}" for a, b in itertools.pairwise(hops)]
        latency = self._one_way(src.dc, dst.dc)
        latency += (self.topology.dc(src.dc).latency_s + self.topology.dc(dst.dc).latency_s) / 2
        return (f"up:{src.lead}", *wan, f"down:{dst.lead}"), latency

    def _pair(self, src: _Worker, dst: _Worker, latency: float, largest: float) -> Pair:
        """The pair's connections; `largest`: the biggest message they carry, which decides
        whether they are paced (testbed.pacing), as in the emulator."""
        key = (src.lead, dst.lead)
        if key not in self.pairs:
            tcp_src, tcp_dst = self.topology.tcp_for(src.dc), self.topology.tcp_for(dst.dc)
            window = WINDOW_EFFICIENCY * min(tcp_src.wmem[2], tcp_dst.rmem[2])
            connections = self.plan.connections_between(src.lead, dst.lead) * len(src.gpus)
            self.pairs[key] = Pair(
                connections, window, max(2 * latency, 1e-5), tcp_src.slow_start_after_idle,
                tcp_src.rto_min_s or RTO_MIN, paced(self.topology, src.dc, dst.dc, largest),
            )
        pair = self.pairs[key]
        pair.rtt = max(2 * latency, 1e-5)  # a latency event changes it for later rounds
        return pair

    def _send(
        self,
        now: float,
        src: _Worker,
        dst: _Worker,
        nbytes: int,
        on_arrival: Any,
        kind: str,
        microbatch: int | None,
        iteration: int,
    ) -> None:
        resources, latency = self._path(src, dst)
        pair = self._pair(src, dst, latency, nbytes if kind != "ALLREDUCE" else GRADIENTS)
        link = None if src.dc == dst.dc else f"{src.dc}>{dst.dc}"

        def arrived(t: float, started: float = now) -> None:
            self.spans.append(
                {
                    "gpu": dst.lead,
                    "kind": "transfer",
                    "start": started,
                    "end": t,
                    "iteration": iteration,
                    "microbatch": microbatch,
                    "bytes": nbytes,
                    "link": link,
                    "src": src.lead,
                    "dst": dst.lead,
                    "stage": dst.stage,
                    "peer": src.lead,
                }
            )
            on_arrival(t)

        def sent(t1: float, t2: float) -> None:
            self.spans.append(
                {
                    "gpu": src.lead,
                    "kind": "send",
                    "start": t1,
                    "end": t2,
                    "iteration": iteration,
                    "microbatch": microbatch,
                    "bytes": nbytes,
                    "link": link,
                    "peer": dst.lead,
                    "stage": src.stage,
                }
            )
            self._next_on_pair(pair, t2)

        def begin(t: float, on_sent: Callable[[float, float], None] = sent) -> None:
            """Queue the message on its pair; `on_sent(t1, t2)` when its last byte left."""
            self._fifo(
                t,
                pair,
                lambda t1: self.network.start(
                    t1,
                    nbytes,
                    resources,
                    pair,
                    latency,
                    lambda t2: arrived(t2, t1),
                    lambda t2: on_sent(t1, t2),
                ),
            )

        arbitrated = (
            link is not None
            and kind in ("SEND_F", "SEND_B")
            and self.plan.sharing.get((src.dc, dst.dc)) is Sharing.ARBITRATED
        )
        if not arbitrated:
            begin(now)
            return
        self._transfer_ids += 1
        transfer = Transfer(
            self._transfer_ids,
            src.lead,
            dst.lead,
            src.dc,
            dst.dc,
            Op(kind),
            src.replica,
            src.stage,
            microbatch if microbatch is not None else -1,
            nbytes,
            now,
            iteration,
        )

        def granted(t: float, requested: float = now) -> None:
            self.spans.append(
                {
                    "gpu": src.lead,
                    "kind": "wait_grant",
                    "start": requested,
                    "end": t,
                    "iteration": iteration,
                    "microbatch": microbatch,
                    "link": link,
                    "peer": dst.lead,
                    "stage": src.stage,
                }
            )

            def left(t1: float, t2: float) -> None:
                sent(t1, t2)  # the last byte is on the link: the lane is free
                nxt = self.arbiter.release(transfer)
                if nxt is not None:
                    self._grant(t2, nxt)

            begin(t, left)

        self._starters[transfer.id] = granted
        chosen = self.arbiter.request(transfer)
        if chosen is not None:
            self._grant(now, chosen)

    def _fifo(self, now: float, pair: Pair, start: Any) -> None:
        """Messages between two workers go one at a time, in order (as in the transport)."""
        queue = self._pair_queue.setdefault(id(pair), [])
        queue.append(start)
        if len(queue) == 1:
            start(now)

    def _next_on_pair(self, pair: Pair, now: float) -> None:
        queue = self._pair_queue[id(pair)]
        queue.pop(0)
        if queue:
            queue[0](now)

    def _grant(self, now: float, transfer: Transfer) -> None:
        self._starters.pop(transfer.id)(now)

    # --- workers ---------------------------------------------------------------------

    def run(self) -> SimResult:
        for worker in self.workers.values():
            self.queue.at(0.0, functools.partial(self._advance, worker))
        self.queue.run()
        stuck = [w.lead for w in self.workers.values() if not w.done]
        if stuck:
            raise RuntimeError(f"simulation stalled with {', '.join(stuck[:4])} unfinished")
        end = max((s["end"] for s in self.spans), default=0.0)
        self.spans.extend(event_spans(self.events, 0.0, end))
        return SimResult(self.spans, 0.0, 0)

    def _span(
        self,
        worker: _Worker,
        kind: str,
        start: float,
        end: float,
        microbatch: int | None = None,
        **extra: Any,
    ) -> None:
        for gpu in worker.gpus:
            self.spans.append(
                {
                    "gpu": gpu,
                    "kind": kind,
                    "start": start,
                    "end": end,
                    "iteration": worker.iteration,
                    "stage": worker.stage,
                    "microbatch": microbatch,
                    **extra,
                }
            )

    def _advance(self, worker: _Worker, now: float) -> None:
        while True:
            if worker.pc == len(worker.actions):
                worker.iteration += 1
                worker.pc = 0
                if worker.iteration == self.job.iterations:
                    worker.done = True
                    return
            action = worker.actions[worker.pc]
            op, mb = action.op, action.microbatch
            cost = self.costs[worker.stage]
            if op in (Op.F, Op.B):
                duration = cost.forward_s if op is Op.F else cost.backward_s
                self._span(worker, "forward" if op is Op.F else "backward", now, now + duration, mb)
                worker.pc += 1
                self.queue.at(now + duration, functools.partial(self._advance, worker))
                return
            if op is Op.STEP:
                self._span(worker, "step", now, now + self.step_s)
                worker.pc += 1
                if self.step_s:
                    self.queue.at(now + self.step_s, functools.partial(self._advance, worker))
                    return
                continue
            if op in (Op.SEND_F, Op.SEND_B):
                forward = op is Op.SEND_F
                peer = self.workers[(worker.replica, worker.stage + (1 if forward else -1))]
                tag = (
                    "F" if forward else "B",
                    worker.iteration,
                    worker.replica,
                    peer.stage,
                    mb if mb is not None else -1,
                )
                self._send(
                    now,
                    worker,
                    peer,
                    self.job.activation_bytes,
                    lambda t, k=tag: self._deliver(k, t),
                    op.value,
                    mb,
                    worker.iteration,
                )
                worker.pc += 1
                continue
            if op in (Op.RECV_F, Op.RECV_B):
                tag = (
                    "F" if op is Op.RECV_F else "B",
                    worker.iteration,
                    worker.replica,
                    worker.stage,
                    mb if mb is not None else -1,
                )
                if tag in self.mailbox:
                    self.mailbox.discard(tag)
                    self._span(worker, "recv", now, now, mb, action=worker.pc)
                    worker.pc += 1
                    continue
                self.waiting[tag] = worker
                worker.waiting_since = now
                self._fill_bubble(worker, now)
                return
            if op is Op.ALLREDUCE:
                self._allreduce_arrive(worker, now)
                return
            worker.pc += 1  # PREFILL and anything else without a cost

    def _deliver(self, tag: tuple[str, int, int, int, int], now: float) -> None:
        worker = self.waiting.pop(tag, None)
        if worker is None:
            self.mailbox.add(tag)
            return
        self._span(worker, "recv", worker.waiting_since, now, tag[4], action=worker.pc)
        if self.bubbles is not None:
            self.bubbles.record_wait(
                worker.lead, worker.pc, worker.iteration, now - worker.waiting_since
            )
        worker.pc += 1
        if worker.prefill_until > now:  # the GPU is still busy with a prefill
            worker.resume_after_prefill = True
            return
        self._advance(worker, now)

    # --- bubbles ---------------------------------------------------------------------

    def _fill_bubble(self, worker: _Worker, now: float) -> None:
        """The GPU is about to wait: let the bubble policy start a prefill."""
        if self.bubbles is None or self.job.inference is None:
            return
        request = self.bubbles.on_idle(worker.lead, worker.pc, now, worker.waiting_since)
        if request is None:
            return
        gpu = self.topology.gpu(worker.lead).type
        duration = modeled_prefill_s(self.job.inference, gpu, request.prompt_len)
        worker.prefill_started, worker.prefill_until = now, now + duration
        self._span(
            worker,
            "prefill",
            now,
            now + duration,
            request=request.id,
            prompt_len=request.prompt_len,
        )
        self.queue.at(now + duration, functools.partial(self._prefilled, worker, request))

    def _prefilled(self, worker: _Worker, request: Request, now: float) -> None:
        assert self.bubbles is not None and self.job.inference is not None
        self.bubbles.prefilled(request, now - worker.prefill_started)
        worker.prefill_until = 0.0
        self._ship_kv(worker, request, now)
        if worker.resume_after_prefill:
            worker.resume_after_prefill = False
            self._advance(worker, now)
        else:
            self._fill_bubble(worker, now)  # still waiting: maybe another one fits

    def _ship_kv(self, worker: _Worker, request: Request, now: float) -> None:
        assert self.bubbles is not None and self.job.inference is not None
        nbytes = kv_bytes(self.job.inference, request.prompt_len)
        decode = self._decode_dc(worker.dc)
        hops = self.topology.path(worker.dc, decode)
        wan = tuple(f"wan:{a}>{b}" for a, b in itertools.pairwise(hops))
        latency = self._one_way(worker.dc, decode) + self.topology.dc(decode).latency_s
        pair = self._decode_pairs.setdefault(
            worker.lead,
            Pair(
                1,
                WINDOW_EFFICIENCY * self.topology.tcp_for(worker.dc).wmem[2],
                max(2 * latency, 1e-5),
                self.topology.tcp_for(worker.dc).slow_start_after_idle,
            ),
        )
        broker = self.bubbles

        def delivered(t: float, started: float = now) -> None:
            broker.delivered(request.id, t, nbytes)
            self.spans.append(
                {
                    "gpu": worker.lead,
                    "kind": "kv_transfer",
                    "start": started,
                    "end": t,
                    "iteration": worker.iteration,
                    "bytes": nbytes,
                    "request": request.id,
                    "stage": worker.stage,
                    "link": None if worker.dc == decode else f"{worker.dc}>{decode}",
                }
            )

        self.network.start(
            now,
            nbytes,
            (f"up:{worker.lead}", *wan, f"down:decode-{decode}"),
            pair,
            latency,
            delivered,
        )

    # --- all-reduce ------------------------------------------------------------------

    def _allreduce_arrive(self, worker: _Worker, now: float) -> None:
        key = (worker.stage, worker.iteration)
        ring = self.rings.setdefault(key, _Ring())
        ring.arrived[worker.replica] = now
        if len(ring.arrived) < self.plan.dp:
            return
        members = [self.workers[(r, worker.stage)] for r in range(self.plan.dp)]
        dcs = {m.dc for m in members}
        grad = self.costs[worker.stage].grad_bytes
        if len(dcs) == 1:
            dc = self.topology.dc(worker.dc)
            duration = ring_allreduce_s(
                grad, self.plan.dp, dc.bandwidth_bps * len(worker.gpus), dc.latency_s
            )
            self.queue.at(now + duration, lambda t: self._allreduce_done(key, members, t))
        else:
            self._ring_step(key, members, now)

    def _ring_step(self, key: tuple[int, int], members: list[_Worker], now: float) -> None:
        """One step of a ring that crosses DCs: every member sends 1/n to its successor."""
        ring = self.rings[key]
        n = len(members)
        if ring.step == 2 * (n - 1):
            self._allreduce_done(key, members, now)
            return
        ring.landed = 0
        chunk = self.costs[key[0]].grad_bytes // n

        def landed(t: float) -> None:
            ring.landed += 1
            if ring.landed == n:
                ring.step += 1
                self._ring_step(key, members, t)

        for i, member in enumerate(members):
            successor = members[(i + 1) % n]
            self._send(now, member, successor, chunk, landed, "ALLREDUCE", None, key[1])

    def _allreduce_done(self, key: tuple[int, int], members: list[_Worker], now: float) -> None:
        ring = self.rings.pop(key)
        for member in members:
            self._span(
                member,
                "allreduce",
                ring.arrived[member.replica],
                now,
                bytes=self.costs[key[0]].grad_bytes,
            )
            member.pc += 1
            self.queue.at(now, functools.partial(self._advance, member))


def _link_key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)
