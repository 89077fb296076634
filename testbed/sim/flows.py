"""The TCP state of a flow in the flow model (testbed.sim.network): its pair of endpoints'
connections and window, what is left of its bytes and of its round's window, and how a
round of slow start that changes nothing but the window moves them. Pure."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from testbed.plan.pacing import PACING_RATIO
from testbed.plan.tcp_model import MSS

INITIAL_WINDOW = 10 * MSS
RTO_MIN = 0.2
MIN_RTT_S = 1e-5
"""The shortest round trip a pair has, whatever its links' latency: the hosts' own stacks.
Time dilation slows the represented network, not the hosts, so this floor is not scaled
by K in a dilated topology."""


@dataclass
class Pair:
    """The TCP connections between two endpoints, and their congestion window."""

    connections: int
    window: float
    """Per connection, bytes."""
    rtt: float
    restart_after_idle: bool
    rto_min: float = RTO_MIN
    paced: bool = False
    cwnd: float = INITIAL_WINDOW
    last_active: float = float("-inf")
    active: int = 0
    coaster: Flow | None = None
    """Its flow while that flow's rounds run implicitly (FluidNetwork's coasting)."""

    def begin(self, now: float) -> None:
        """Linux's restart after idle: the window halves for every RTO the pair sat idle,
        down to the initial window (tcp_cwnd_restart)."""
        if self.active == 0 and self.restart_after_idle:
            idle = now - self.last_active
            rto = self.rto_min + self.rtt
            while idle > rto and self.cwnd > INITIAL_WINDOW:
                self.cwnd = max(INITIAL_WINDOW, self.cwnd / 2)
                idle -= rto
        self.active += 1

    def end(self, now: float) -> None:
        self.active -= 1
        self.last_active = now

    def round_budget(self) -> float:
        """Bytes one flow of this pair may send in a round."""
        return self.connections * min(self.cwnd, self.window) / max(1, self.active)

    def paced_cap(self) -> float:
        """bit/s one flow of the pair may send while its window grows: paced senders
        spread each round's window over 1/PACING_RATIO of the round trip."""
        return PACING_RATIO * self.round_budget() * 8 / self.rtt

    def steady_cap(self) -> float:
        """bit/s one flow of the pair reaches with a full window: window per RTT."""
        return self.connections * self.window * 8 / self.rtt / max(1, self.active)

    def acked(self, nbytes: float) -> None:
        """Slow start: every byte acknowledged grows the window by a byte (so a window
        used in full doubles per RTT), up to the socket buffers' limit."""
        self.cwnd = min(self.window, self.cwnd + nbytes / self.connections)


@dataclass
class Flow:
    id: int
    resources: tuple[str, ...]
    pair: Pair
    latency: float
    on_arrival: Callable[[float], None]
    remaining: float
    budget: float = 0.0
    round_budget: float = 0.0
    rate: float = 0.0
    updated: float = 0.0
    version: int = 0
    paused: bool = False
    round_id: int = 0
    on_sent: Callable[[float], None] | None = None
    scheduled: bool = False
    steady: bool = False
    """The window is at its limit: ACK-clocked at window/RTT, no more rounds to track."""
    round_end: float = float("inf")
    coasting: bool = False
    """Its rounds from `round_end` on are plain (`plain_round`) and run implicitly, each
    when something reads the flow, none by an event of its own."""
    coast_id: int = 0
    """Tells a coast's last event from an earlier coast's."""

    def progress(self, now: float) -> None:
        sent = self.rate / 8 * (now - self.updated)
        remaining, budget = self.remaining - sent, self.budget - sent
        # max(0.0, x) written out: the hottest lines of a run
        self.remaining = remaining if remaining > 0.0 else 0.0
        self.budget = budget if budget > 0.0 else 0.0
        self.updated = now


def cap(flow: Flow) -> float:
    """bit/s the flow may not exceed whatever the links leave it: window per RTT once
    steady, a multiple of its round's window while paced, none otherwise."""
    pair = flow.pair
    if flow.steady:
        return pair.steady_cap()
    return pair.paced_cap() if pair.paced else float("inf")


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
    cwnd += (round_budget - budget) / pair.connections
    if cwnd >= window:
        return None
    budget = pair.connections * cwnd / active
    new_cap = PACING_RATIO * budget * 8 / rtt if pair.paced else float("inf")
    if not (flow.rate < old_cap and flow.rate < new_cap):
        return None
    if now + (remaining if remaining <= budget else budget) * 8 / flow.rate <= now + rtt:
        return None
    return now, remaining, budget, budget, cwnd
