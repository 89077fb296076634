"""Plain rounds of slow start and of congestion avoidance, run without events of their own.

A round whose end changes no share (its flow sends at a rate no cap sets, before and after)
and leaves no event of the flow's own due needs no event: the network runs such rounds
when it next reads the flow (FluidNetwork._coast, _settle), here, with the arithmetic of a
round end step for step, so the results are the same to the bit as with an event per round
(`FluidNetwork.coast` off).
"""

from __future__ import annotations

from testbed.plan.pacing import PACING_RATIO
from testbed.sim.flows import Flow, past_threshold

State = tuple[float, float, float, float, float]
"""(updated, remaining, budget, round_budget, cwnd): what a round of a flow changes."""


def state_of(flow: Flow) -> State:
    return flow.updated, flow.remaining, flow.budget, flow.round_budget, flow.pair.cwnd


def plain_round(flow: Flow, now: float, state: State) -> State | None:
    """The flow's state after its round that ends at `now`, if that round is plain: the
    flow sends at a rate its cap does not set, before and after (so no share changes),
    its window stays short of the socket buffers, and neither its bytes nor its next
    round's window run out before that round ends (so no event of its own is due). None
    otherwise. Step for step the arithmetic of a round end (FluidNetwork._round_over):
    progress, Pair.acked, the round's opening and the flow's next event, so that rounds
    run here come out to the bit as if each had its own event."""
    pair = flow.pair
    if pair.lossy:
        return None
    updated, remaining, budget, round_budget, cwnd = state
    # max and min written out (the same values): a large run calls this a million times
    sent = flow.rate / 8 * (now - updated)
    remaining -= sent
    if not remaining > 0.0:
        remaining = 0.0
    budget -= sent
    if not budget > 0.0:
        budget = 0.0
    window, rtt = pair.window, pair.rtt
    active = pair.active if pair.active > 1 else 1
    old_cap = PACING_RATIO * (pair.connections * (cwnd if cwnd <= window else window)
                              / active) * 8 / rtt if pair.paced else float("inf")
    each = (round_budget - budget) / pair.connections
    if cwnd + each <= pair.ssthresh:
        cwnd += each
    else:  # past its threshold: congestion avoidance, as Pair.acked grows it
        cwnd = past_threshold(pair, cwnd, each, now)
    if cwnd >= window:
        return None
    budget = pair.connections * cwnd / active
    new_cap = PACING_RATIO * budget * 8 / rtt if pair.paced else float("inf")
    if not (flow.rate < old_cap and flow.rate < new_cap):
        return None
    if now + (remaining if remaining <= budget else budget) * 8 / flow.rate <= now + rtt:
        return None
    return now, remaining, budget, budget, cwnd


LOOKAHEAD = 64
"""Rounds a coast looks ahead at most: a flow read early in a long coast is looked ahead
for again when it next coasts."""


def run_round(flow: Flow, now: float, state: State) -> None:
    """Apply a plain round ending at `now`, as its event would have: the new state, the
    next round open, the flow's event known to fall after it."""
    flow.updated, flow.remaining, flow.budget, flow.round_budget, flow.pair.cwnd = state
    flow.paused, flow.scheduled = False, True
    flow.round_id += 1
    flow.version += 1
    flow.round_end = flow.round_ack = now + flow.pair.rtt


def catch_up(flow: Flow, until: float, inclusive: bool) -> None:
    """Run the coasting flow's plain rounds that end before `until` (or at it)."""
    while flow.round_end < until or (inclusive and flow.round_end == until):
        state = plain_round(flow, flow.round_end, state_of(flow))
        if state is None:
            return
        run_round(flow, flow.round_end, state)
