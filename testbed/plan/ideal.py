"""A schedule's own bubble: its GPUs' idle share when every stage takes the same time and
messages are free, read from the plan's compute order (so it holds for any schedule:
(p-1)/(m+p-1) for GPipe and 1F1B over p stages, less interleaved, about none for the
zero-bubble ones). Pure."""

from __future__ import annotations

from testbed.plan.model import Action, Op, Plan

UNIT = {Op.F: 1.0, Op.B: 2.0, Op.I: 1.0, Op.W: 1.0}
"""A backward costs two forwards (as testbed.plan.compute models it); torch's zero-bubble
schedules assume its halves equal."""


def ideal_bubble_fraction(plan: Plan) -> float:
    """Idle share of replica 0's GPUs over one iteration's compute, the GPUs waiting only
    for the computes their inputs come from (nan if the order cannot run)."""
    gpus = list(dict.fromkeys(gpus[0] for (r, _), gpus in plan.workers() if r == 0))
    orders = {gpu: [a for a in plan.actions[gpu] if a.op.is_compute] for gpu in gpus}
    last = plan.pp - 1
    done: dict[tuple[str, int, int], float] = {}
    """When each ("F" forward / "G" input gradient / "W", stage, microbatch) ended."""
    free = dict.fromkeys(gpus, 0.0)
    busy = dict.fromkeys(gpus, 0.0)
    pcs = dict.fromkeys(gpus, 0)
    while any(pcs[g] < len(orders[g]) for g in gpus):
        progressed = False
        for gpu in gpus:
            while pcs[gpu] < len(orders[gpu]):
                action = orders[gpu][pcs[gpu]]
                ready = [_ready(leaf, last, done) for leaf in action.leaves]
                if any(r is None for r in ready):
                    break
                start = max([free[gpu], *(r for r in ready if r is not None)])
                length = sum(UNIT[leaf.op] for leaf in action.leaves)
                free[gpu] = start + length
                busy[gpu] += length
                for leaf in action.leaves:
                    done[(_KIND[leaf.op], leaf.stage, leaf.microbatch or 0)] = free[gpu]
                pcs[gpu] += 1
                progressed = True
        if not progressed:
            return float("nan")
    span = max(free.values(), default=0.0)
    return 1 - sum(busy.values()) / (len(gpus) * span) if span else 0.0


_KIND = {Op.F: "F", Op.B: "G", Op.I: "G", Op.W: "W"}


def _ready(leaf: Action, last: int, done: dict[tuple[str, int, int], float]) -> float | None:
    """When a compute's inputs are there; None while one is still to come."""
    stage, mb = leaf.stage, leaf.microbatch or 0
    if leaf.op is Op.F:
        needs = [("F", stage - 1, mb)] if stage > 0 else []
    elif leaf.op is Op.W:
        needs = [("G", stage, mb)]
    else:
        needs = [("F", stage, mb)] + ([("G", stage + 1, mb)] if stage < last else [])
    times = [done.get(key) for key in needs]
    return None if any(t is None for t in times) else max([0.0, *(t for t in times if t)])
