"""All-reduces among the replicas of a stage (testbed.plan.collective says what, which
part, in which payload and among whom): a closed form inside one DC, and a ring of real
transfers through the network model when the members span DCs.

Members meet by order: the k-th all-reduce a replica joins in its group is the k-th of
every other member (the validator has checked they are the same collective in the same
iteration). Dense payloads go round a ring all-reduce, 2(n-1) steps of 1/n of the bytes
each; sparse ones (top-k) a ring all-gather, n-1 steps of one member's bytes each. A
member that started its all-reduce and went on computing (ALLREDUCE_START) shares the
network with its pipeline's traffic meanwhile."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field

from testbed.common.span_table import SpanTable
from testbed.job.model import Job
from testbed.plan.buckets import bucket_ready
from testbed.plan.collective import Collective, Scope
from testbed.plan.compute import collective_bytes, ring_allgather_s, ring_allreduce_s
from testbed.plan.interpret import Compute, Part, Phase, ReduceStart, Send
from testbed.plan.model import Op, Plan
from testbed.sim.network import Schedule
from testbed.sim.transfers import Transfers
from testbed.sim.workers import Joined, Resume, SimWorker
from testbed.topology.model import Topology

GroupKey = tuple[int, Scope, str]
"""(stage, scope, datacenter or '' for all replicas)."""


@dataclass
class _Reduce:
    """One all-reduce of one group in progress."""

    collective: Collective
    members: list[SimWorker]
    nbytes: int
    """What each member contributes, in the collective's payload."""
    joined: dict[int, Joined] = field(default_factory=dict)
    """Each replica's part, once it joined."""
    step: int = 0
    landed: int = 0


class AllReduces:
    def __init__(self, topology: Topology, job: Job, plan: Plan,
                 workers: Mapping[tuple[int, int], SimWorker], transfers: Transfers,
                 at: Schedule, spans: SpanTable) -> None:
        self.topology, self.job, self.plan, self.workers = topology, job, plan, workers
        self.transfers, self.at, self.spans = transfers, at, spans
        self._joins: dict[tuple[GroupKey, int], int] = {}
        """All-reduces each replica joined so far in each group."""
        self._under_way: dict[tuple[GroupKey, int], _Reduce] = {}
        """By group and index in it."""
        self._groups: dict[GroupKey, list[SimWorker]] = {}
        self._bytes: dict[tuple[int, Collective], int] = {}
        self._ready: dict[tuple[int, Collective], float] = {}

    def in_backward(self, worker: SimWorker,
                    timed: list[tuple[Compute, float, float]]) -> None:
        """Join each START that follows the compute at the worker's step (sends between
        them aside) in its backward, when that backward has the bucket's values
        (testbed.plan.buckets: the units' backward in proportion to their FLOPs)."""
        steps, index = worker.steps, worker.pc + 1
        while index < len(steps):
            step = steps[index]
            if isinstance(step, ReduceStart) and step.backward == worker.pc:
                start, end = next((s, e) for c, s, e in timed if c.stage == step.stage
                                  and c.phase is Phase.BACKWARD and c.part is not Part.INPUT)
                key = (step.stage, step.collective)
                if key not in self._ready:
                    self._ready[key] = bucket_ready(self.job.model, self.plan.layers,
                                                    step.stage, step.collective)
                worker.early[(worker.iteration, index)] = True
                self.at(start + self._ready[key] * (end - start),
                        functools.partial(self._join_early, worker, step))
            elif not isinstance(step, Send):
                return
            index += 1

    def _join_early(self, worker: SimWorker, step: ReduceStart, now: float) -> None:
        worker.under_way[(step.stage, step.collective)] = self.join(
            worker, step.stage, step.collective, now, None, None)

    def join(self, worker: SimWorker, stage: int, collective: Collective, now: float,
             action: int | None, resume: Resume | None) -> Joined:
        """The worker's next all-reduce of `stage` (one it holds) in its group for
        `collective`. `action`: the
        ALLREDUCE it waits at, with `resume(member, t)` to carry on once the result is in
        (passed per call and dropped with the all-reduce, so that the simulator and this
        do not hold each other); None for one it started and goes on from. A group of one
        is done at once (nothing moves): the caller moves on itself."""
        key = (stage, collective.scope, worker.dc if collective.scope is Scope.DC else "")
        members = self._group(key)
        index = self._joins.get((key, worker.replica), 0)
        self._joins[(key, worker.replica)] = index + 1
        joined = Joined(worker, now, worker.iteration, action, stage, resume=resume)
        nbytes = self._bytes_of(stage, collective)
        if len(members) == 1:
            self._record(joined, collective, nbytes, now)
            joined.done, joined.resume = True, None
            return joined
        reduce = self._under_way.setdefault((key, index), _Reduce(collective, members, nbytes))
        if reduce.collective != collective:
            raise RuntimeError(
                f"{worker.lead} joins all-reduce [{collective}] where its group's #{index} is "
                f"[{reduce.collective}]: replicas must reduce the same collective in the same "
                "iteration")
        reduce.joined[worker.replica] = joined
        if len(reduce.joined) < len(members):
            return joined
        dcs = {m.dc for m in members}
        if len(dcs) == 1:
            dc = self.topology.dc(worker.dc)
            model = ring_allgather_s if collective.gathers else ring_allreduce_s
            duration = model(nbytes, len(members), dc.bandwidth_bps * len(worker.gpus),
                             dc.latency_s)
            self.at(now + duration, lambda t: self._done((key, index), t))
        else:
            self._ring_step((key, index), now)
        return joined

    def _group(self, key: GroupKey) -> list[SimWorker]:
        """The stage's replicas in the group, by replica: all of them, or those whose
        stage's lead GPU is in the datacenter."""
        members = self._groups.get(key)
        if members is None:
            stage, scope, dc = key
            members = self._groups[key] = [
                self.workers[(r, stage)] for r in range(self.plan.dp)
                if scope is Scope.ALL or self.workers[(r, stage)].dc == dc]
        return members

    def _bytes_of(self, stage: int, collective: Collective) -> int:
        known = self._bytes.get((stage, collective))
        if known is None:
            known = self._bytes[(stage, collective)] = collective_bytes(
                self.job, self.plan.layers, stage, collective, self.plan.tp)
        return known

    def _ring_step(self, key: tuple[GroupKey, int], now: float) -> None:
        """One step of a ring that crosses DCs: every member sends to its successor 1/n of
        the bytes (all-reduce) or one member's bytes (all-gather)."""
        reduce = self._under_way[key]
        members = reduce.members
        n = len(members)
        gathers = reduce.collective.gathers
        if reduce.step == (n - 1 if gathers else 2 * (n - 1)):
            self._done(key, now)
            return
        reduce.landed = 0
        chunk = reduce.nbytes if gathers else reduce.nbytes // n
        iteration = max(j.iteration for j in reduce.joined.values())

        def landed(t: float) -> None:
            reduce.landed += 1
            if reduce.landed == n:
                reduce.step += 1
                self._ring_step(key, t)

        stage = key[0][0]
        for i, member in enumerate(members):
            successor = members[(i + 1) % n]
            self.transfers.send(now, member, successor, chunk, landed, Op.ALLREDUCE, None,
                                iteration, stage, stage, reduce.collective)

    def _done(self, key: tuple[GroupKey, int], now: float) -> None:
        reduce = self._under_way.pop(key)
        for member in reduce.members:
            joined = reduce.joined[member.replica]
            self._record(joined, reduce.collective, reduce.nbytes, now)
            joined.done = True
            if joined.resume is not None:
                member.pc += 1
                self.at(now, functools.partial(joined.resume, member))
                joined.resume = None

    def _record(self, joined: Joined, collective: Collective, nbytes: int, now: float) -> None:
        """The member's all-reduce, from its join to the result; a blocking one is a wait
        at its action (which bubble predictions key on)."""
        if joined.action is None:
            joined.worker.record(self.spans, "allreduce", joined.at, now,
                                 iteration=joined.iteration, bytes=nbytes,
                                 collective=str(collective), stage=joined.stage)
        else:
            joined.worker.record(self.spans, "allreduce", joined.at, now,
                                 iteration=joined.iteration, bytes=nbytes,
                                 collective=str(collective), action=joined.action,
                                 stage=joined.stage)
