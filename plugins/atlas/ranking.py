"""Which transfer waiting on a WAN link Atlas grants next under the `microbatch` order:
the one its receiver needs soonest. Each queue's transfers are ranked once, as they first
wait, in a heap: hundreds wait on a link at scale, and the queue is asked at every grant."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence

from testbed.policy.api import Action, Op, Plan, Transfer

Rank = tuple[int, int, int, int]
"""(iteration, where its receiver waits for it, replica, id): unique, ending in the id."""


class Queues:
    """A plan's waiting transfers ranked per link direction and DP-cell (the arbiter's
    queues: testbed.policy.arbiter)."""

    def __init__(self, plan: Plan) -> None:
        self.cell_of = {replica: i for i, cell in enumerate(plan.dp_cells) for replica in cell}
        self.ranked: dict[tuple[tuple[str, str], int], Ranked] = {}

    def of(self, link: tuple[str, str], replica: int) -> Ranked:
        key = (link, self.cell_of.get(replica, 0))
        if key not in self.ranked:
            self.ranked[key] = Ranked()
        return self.ranked[key]


class Ranked:
    """One queue's transfers in a heap by rank, each ranked when first seen waiting: the
    least one still waiting is the least rank over the queue, since every transfer
    waiting is in the heap and ranks are unique."""

    def __init__(self) -> None:
        self.heap: list[tuple[Rank, int, Transfer]] = []
        self.held: dict[int, Transfer] = {}
        """The transfers in the heap, by id() (the heap holds them: no id is reused)."""
        self.count = itertools.count()
        """Breaks ties between equal ranks: one run's transfer left over from another run
        of the same plan (stopped early) and its namesake."""

    def least(self, waiting: Sequence[Transfer], rank: Callable[[Transfer], Rank]) -> Transfer:
        """`waiting` is in the order the transfers came (the arbiter's): those that came
        since the last call are the ones after the last it held, so a grant looks at
        them alone, where a set of every waiting transfer would cost hundreds a grant."""
        held, heap = self.held, self.heap
        for transfer in reversed(waiting):
            if id(transfer) in held:
                break
            held[id(transfer)] = transfer
            heapq.heappush(heap, (rank(transfer), next(self.count), transfer))
        # every waiting transfer is held now: where no more are, each held one waits
        here = None if len(held) == len(waiting) else set(map(id, waiting))
        while True:
            _, _, transfer = heapq.heappop(heap)
            del held[id(transfer)]
            if here is None or id(transfer) in here:
                return transfer
            # no longer waiting (a run that stopped early left it): dropped


def needed_at(plan: Plan, receives: dict[str, dict[Action, int]], transfer: Transfer) -> int:
    """Where the receiving stage waits for this transfer in its action list."""
    forward = transfer.kind is Op.SEND_F
    stage = transfer.stage + (1 if forward else -1)
    gpu = plan.lead_gpu(transfer.replica, stage)
    positions = receives.get(gpu)
    if positions is None:
        positions = receives[gpu] = {action: i for i, action in enumerate(plan.actions[gpu])
                                     if action.op in (Op.RECV_F, Op.RECV_B)}
    wanted = Action(stage, Op.RECV_F if forward else Op.RECV_B, transfer.microbatch)
    return positions.get(wanted, len(plan.actions[gpu]))
