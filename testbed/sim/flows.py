"""The TCP state of a flow in the flow model (testbed.sim.network): its pair of endpoints'
connections and window, what is left of its bytes and of its round's window, and how a
round of slow start that changes nothing but the window moves them. Pure."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from testbed.plan.pacing import PACING_RATIO, paced
from testbed.plan.tcp_model import (
    MSS,
    LossResponse,
    in_flight_bytes,
    loss_response,
    restarts_after_idle,
    rtt_bias,
)
from testbed.topology.model import Topology

INITIAL_WINDOW = 10 * MSS
TAIL_PACKETS = 3
SETTLED = 0.01
"""A loss cycle whose window at the loss is within this of the last one's repeats."""
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
    rtt_bias: float = 0.0
    """Its share of a bottleneck against pairs of other round trips goes as RTT^-rtt_bias
    (testbed.plan.tcp_model.rtt_bias)."""
    response: LossResponse | None = None
    """How its congestion control answers random loss; None: it does not."""
    loss: float = 0.0
    """The packet loss of its path (a network event changes it for its next message)."""
    cwnd: float = INITIAL_WINDOW
    last_active: float = float("-inf")
    active: int = 0
    coaster: Flow | None = None
    """Its flow while that flow's rounds run implicitly (FluidNetwork's coasting)."""
    ssthresh: float = float("inf")
    w_max: float = 0.0
    """The window at the last loss, per connection (CUBIC's W_max)."""
    epoch: float = 0.0
    """When the last loss was."""
    since_loss: float = 0.0
    """Bytes each connection sent since its last loss."""
    buffers_window: float = 0.0
    """`window` as the buffers set it, while a settled loss cycle sets `window`."""
    settled: bool = False
    """Its loss cycle repeats: its window is the cycle's mean, and no loss is tracked."""
    conserved: bool = False
    """BBR: its last round was one of recovery's packet conservation."""

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

    def weight(self) -> float:
        """What one flow of this pair weighs in max-min sharing: its connections, less
        for a longer round trip by the congestion control's RTT bias. The round trip is
        counted in units of the stack's minimum RTO, a time dilation stretches as it does
        the round trips: a dilated network shares as the one it represents, also where
        congestion controls of different biases meet (seconds would weigh them otherwise
        at every K), and a flow's weight never depends on which others are under way."""
        weight = self.connections / max(1, self.active)
        return weight * (self.rtt / self.rto_min) ** -self.rtt_bias if self.rtt_bias \
            else weight

    @property
    def lossy(self) -> bool:
        """Whether random loss on its path sets its window, round by round (for BBR,
        until its window reaches the buffers': it grows no further, whatever is lost)."""
        if self.response is None or self.loss <= 0.0 or self.settled:
            return False
        return self.response.beta < 1.0 or self.cwnd < self.window

    def set_loss(self, loss: float) -> None:
        """The path's loss for its next message: a new rate starts its loss cycle anew."""
        if loss != self.loss and self.settled:
            self.settled, self.window = False, self.buffers_window
            self.ssthresh, self.since_loss = float("inf"), 0.0
        self.loss = loss

    def tail_wait(self, last_round_bytes: float) -> float:
        """How much later, on average, a message's last byte arrives on a lossy path than
        on a clean one, whatever the congestion control. A lost segment is sent again
        once a segment sent after it is acknowledged, a round trip after its own send
        (RACK, RFC 8985): a loss among the `last_round_bytes` the message sent in its last
        round trip holds its last byte up by that round trip less the time from the loss
        to the end of sending, the latest such loss counting. Losses come at random (a
        Poisson process over the x packets of that round trip): RTT (1 - (1 - e^-x) / x)
        on average. A loss among a connection's last TAIL_PACKETS packets has too few
        behind it to be noticed, and waits for the tail loss probe (RFC 8985: two round
        trips after the last send), one round trip more."""
        if self.loss <= 0.0:
            return 0.0
        packets = self.loss * last_round_bytes / MSS
        rack = 1.0 + math.expm1(-packets) / packets if packets > 1e-9 else packets / 2
        probe = 1.0 - (1.0 - self.loss) ** (TAIL_PACKETS * self.connections)
        return (rack + probe) * self.rtt

    def acked(self, nbytes: float, now: float = 0.0) -> None:
        """Slow start: every byte acknowledged grows the window by a byte (so a window
        used in full doubles per RTT), up to the socket buffers' limit. On a lossy path,
        a round that brings a connection's bytes since its last loss to 1/loss packets
        has a loss (the mean path of Mathis et al. 1997's periodic model): the window
        drops by the congestion control's factor and grows back as it does
        (LossResponse.window_after)."""
        if not self.lossy:
            self.cwnd = min(self.window, self.cwnd + nbytes / self.connections)
            return
        assert self.response is not None
        per_connection = nbytes / self.connections
        self.since_loss += per_connection
        if self.response.beta >= 1.0:  # BBR: a round of recovery conserves packets
            if self.since_loss >= MSS / self.loss and not self.conserved:
                self.since_loss, self.conserved = 0.0, True
            else:
                self.conserved = False
                self.cwnd = min(self.window, self.cwnd + per_connection)
            return
        if self.since_loss >= MSS / self.loss:
            previous, cycle_s = self.w_max, now - self.epoch
            self.since_loss = 0.0
            self.w_max = min(self.cwnd, self.window)
            self.cwnd = self.ssthresh = max(2 * MSS, self.w_max * self.response.beta)
            self.epoch = now
            if abs(self.w_max - previous) <= SETTLED * previous and cycle_s > 0:
                # the cycle repeats: its mean window from now on, without a round each
                # round trip (which a short round trip would make millions of)
                self.settled, self.buffers_window = True, self.window
                self.window = self.cwnd = min(self.window,
                                              MSS / self.loss / cycle_s * self.rtt)
        elif self.cwnd < self.ssthresh:
            self.cwnd = min(self.window, self.cwnd + per_connection)
        else:
            grown = self.response.window_after(now - self.epoch, self.rtt, self.w_max)
            self.cwnd = min(self.window, max(self.cwnd, min(grown, self.cwnd + per_connection)))


def pair_between(topology: Topology, src_dc: str, dst_dc: str, connections: int, rtt: float,
                 largest: float, loss: float = 0.0, pacing: bool | None = None) -> Pair:
    """The connections from a host of `src_dc` to one of `dst_dc` as the topology's TCP
    settings make them: the window its buffers allow, restart after idle (where its
    congestion control takes it: testbed.plan.tcp_model.restarts_after_idle), its congestion
    control's RTT bias and answer to loss; paced where the emulator paces them
    (testbed.plan.pacing; `largest`: the biggest message they carry) unless `pacing` says."""
    src, dst = topology.tcp_for(src_dc), topology.tcp_for(dst_dc)
    if pacing is None:
        pacing = paced(topology, src_dc, dst_dc, largest)
    return Pair(connections, in_flight_bytes(src, dst), max(rtt, MIN_RTT_S),
                restarts_after_idle(src.congestion, src.slow_start_after_idle),
                src.rto_min_s or RTO_MIN, pacing,
                rtt_bias(src.congestion, pacing), loss_response(src.congestion), loss)


@dataclass
class Flow:
    id: int
    resources: tuple[str, ...]
    pair: Pair
    latency: float
    on_arrival: Callable[[float], None]
    remaining: float
    size: float = 0.0
    """The message's bytes."""
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
    if flow.steady or (pair.lossy and pair.cwnd >= pair.window):
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
