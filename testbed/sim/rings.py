"""The gradient all-reduce of each stage across its replicas: a closed form inside one DC,
and a ring of real transfers through the network model when the replicas span DCs."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from testbed.compute import StageCost, ring_allreduce_s
from testbed.plan.model import Op
from testbed.sim.network import Schedule
from testbed.sim.transfers import Transfers
from testbed.sim.workers import SimWorker
from testbed.spans import Span
from testbed.topology.model import Topology

RingKey = tuple[int, int]
"""(stage, iteration)."""
Resume = Callable[[SimWorker, float], None]


@dataclass
class _Ring:
    """One stage's all-reduce in progress."""

    resume: Resume
    """What runs a member's next steps once the all-reduce is done."""
    arrived: dict[int, float] = field(default_factory=dict)
    """When each replica reached it."""
    step: int = 0
    landed: int = 0


class AllReduces:
    def __init__(self, topology: Topology, dp: int, costs: Sequence[StageCost],
                 workers: Mapping[tuple[int, int], SimWorker], transfers: Transfers,
                 at: Schedule, spans: list[Span]) -> None:
        self.topology, self.dp, self.costs, self.workers = topology, dp, costs, workers
        self.transfers, self.at, self.spans = transfers, at, spans
        self.rings: dict[RingKey, _Ring] = {}

    def arrive(self, worker: SimWorker, now: float, resume: Resume) -> None:
        """The worker waits here until every replica of its stage has arrived; then
        `resume(member, t)` for each. (Passed per call and dropped with the ring, so
        that the simulator and this do not hold each other, which would leave freeing a
        finished simulation to the cycle collector.)"""
        key = (worker.stage, worker.iteration)
        ring = self.rings.setdefault(key, _Ring(resume))
        ring.arrived[worker.replica] = now
        if len(ring.arrived) < self.dp:
            return
        members = [self.workers[(r, worker.stage)] for r in range(self.dp)]
        dcs = {m.dc for m in members}
        grad = self.costs[worker.stage].grad_bytes
        if len(dcs) == 1:
            dc = self.topology.dc(worker.dc)
            duration = ring_allreduce_s(
                grad, self.dp, dc.bandwidth_bps * len(worker.gpus), dc.latency_s
            )
            self.at(now + duration, lambda t: self._done(key, members, t))
        else:
            self._ring_step(key, members, now)

    def _ring_step(self, key: RingKey, members: list[SimWorker], now: float) -> None:
        """One step of a ring that crosses DCs: every member sends 1/n to its successor."""
        ring = self.rings[key]
        n = len(members)
        if ring.step == 2 * (n - 1):
            self._done(key, members, now)
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
            self.transfers.send(now, member, successor, chunk, landed, Op.ALLREDUCE, None, key[1])

    def _done(self, key: RingKey, members: list[SimWorker], now: float) -> None:
        ring = self.rings.pop(key)
        for member in members:
            member.record(self.spans, "allreduce", ring.arrived[member.replica], now,
                          bytes=self.costs[key[0]].grad_bytes, action=member.pc)
            member.pc += 1
            self.at(now, functools.partial(ring.resume, member))
