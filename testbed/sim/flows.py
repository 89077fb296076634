"""The TCP state of a flow in the flow model (testbed.sim.network): its pair of endpoints'
connections and window (on a lossy path, each connection's own, and the pieces of the
message each holds), what is left of its bytes and of its round's window, and how a
round of slow start that changes nothing but the window moves them. Pure."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.plan.pacing import PACING_RATIO, PACING_SHARE, paced
from testbed.plan.striping import CHUNKS_AT_START, chunk_bytes
from testbed.plan.tcp_model import (
    MSS,
    RESTART_THRESHOLD,
    STANDING_QUEUE,
    LossResponse,
    cuts_at_loss,
    in_flight_bytes,
    in_flight_under_loss,
    loss_response,
    restarts_after_idle,
    rtt_bias,
    sawtooth_cv,
)
from testbed.sim.loss_cycles import LossCycle, Stripes, first_losses
from testbed.topology.model import Topology

INITIAL_WINDOW = 10 * MSS
CWND_OF_FLIGHT = 2.0
"""How far past what it keeps in flight a connection's window grows in slow start while
its buffers, not the window, limit it: Linux lets it grow to twice the packets it had out
(tcp_is_cwnd_limited in include/net/tcp.h). A restart after idle halves that larger
window, so after k RTOs idle it sends 2/2^k of its buffers' window, not 1/2^k. Measured
(`ss -tin`, one CUBIC connection, 10 Gbit/s x 60 ms, Linux's default buffers, 21 MB
messages 0.7 s apart): 2,889 segments in flight and a window of 5,812; after the idle,
1,453."""
RTO_MIN = 0.2
MIN_RTT_S = 1e-5
"""The shortest round trip a pair has, whatever its links' latency: the hosts' own stacks.
Time dilation slows the represented network, not the hosts, so this floor is not scaled
by K in a dilated topology."""
Share = float | Callable[[], float]
"""A message's share factor, or what draws it the first time its flow's weight is read."""


@dataclass
class Pair:
    """The TCP connections between two endpoints, and their congestion window: one for
    all on a clean path, where they are alike; one each on a lossy one (`cycles`)."""

    connections: int
    window: float
    """Per connection, bytes: the most it keeps in flight, as its buffers allow (`buffers`),
    or, once its loss cycles settle, their mean."""
    rtt: float
    """Its round trip as its flows see it: `base_rtt` and `queued_s`."""
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
    sawtooth: float = 0.0
    """How unequal its congestion control leaves equal connections' windows at any moment
    (testbed.plan.tcp_model.sawtooth_cv): its messages' share CV with `--jitter
    share=sawtooth`."""
    standing_queue_s: float = 0.0
    """What its bottleneck's queue adds to its round trip on average where its flows share
    that link (testbed.plan.tcp_model.STANDING_QUEUE of its drain time; of links of equal
    rate, the deepest queue's, wherever on the path it is); counted in its weight alone."""
    pacing_bps: float = math.inf
    """What its connections may send together where they are paced: PACING_SHARE of its
    path's slowest link (testbed.plan.pacing); inf unpaced."""
    queued_s: float = 0.0
    """What the standing queues of links its flows or their acknowledgements cross without
    being held there add to its round trip (testbed.sim.queues): in `rtt`, not in
    `base_rtt`."""
    cwnd: float = INITIAL_WINDOW
    """Per connection, bytes: on a lossy path, the mean of its connections' (`cycles`)."""
    ssthresh: float = math.inf
    """Per connection, bytes, on a clean path: where its slow start ends, once a full
    queue's losses cut its window (`cut`); none before."""
    w_max: float = 0.0
    """The window at its last cut (the congestion control's W_max)."""
    epoch: float = 0.0
    """When its last cut was, shifted on by the time it sat idle since (CUBIC's clock runs
    only while it sends: tcp_cubic.c moves its epoch at CA_EVENT_TX_START)."""
    cut_at: float = -math.inf
    last_active: float = float("-inf")
    active: int = 0
    coaster: Flow | None = None
    """Its flow while that flow's rounds run implicitly (FluidNetwork's coasting)."""
    cycles: list[LossCycle] = field(default_factory=list)
    """Each connection's window under random loss, from its first lossy round on."""
    queued_links: list[str] | None = None
    """The WAN links with a queue its bytes and acknowledgements cross, once a flow of its
    has started (testbed.sim.queues.StandingQueues.links)."""
    base_rtt: float = field(init=False)
    """Its round trip over the links alone: `rtt` less `queued_s`."""
    buffers: float = field(init=False)
    """The `window` it was made with: what its buffers allow on a clean path."""
    held: float = field(init=False)
    """What its buffers allow a connection that has lost a packet on its path
    (in_flight_under_loss): `buffers` on a clean one."""
    settled: bool = False
    """Every connection's loss cycle repeats: its window is their mean, and no loss is
    tracked."""
    stripes: Stripes | None = None
    """While one message rides its lossy connections: how (`open_round`)."""
    flights: list[tuple[float, float]] = field(default_factory=list)
    """(when acknowledged, bytes) of rounds whose acknowledgements are still on their way
    (a message's last round, a round cut short by another's acknowledgements): they
    count against the window until then, as TCP's bytes in flight do."""

    def send_off(self, nbytes: float, ack_at: float, now: float) -> None:
        """A round's bytes, acknowledged at `ack_at`: now if that has come, else later."""
        if ack_at <= now or self.lossy or self.active > 1:
            self.acked(nbytes, now)
        else:
            self.flights.append((ack_at, nbytes))

    def round_over(self, nbytes: float, ack_at: float, now: float, window_bound: bool
                   ) -> None:
        """A round's `nbytes` as it ends at `now`. Where its window bound it (the flow
        paused, its window spent), they are in flight until `ack_at` (`send_off`).
        Otherwise its share, not its window, set its pace: what is in flight held nothing
        back, and every flight counts as acknowledged now, as the acknowledgements that
        arrive all through a round trip would free it before the window binds. So a pair
        whose message started beside the last one's tail sends at its share in plain
        rounds again (FluidNetwork's coasting) once the tail no longer holds it back,
        where it would otherwise keep a round's bytes in flight at every round's end
        (one round cut short by the next's acknowledgements, for the rest of the
        message: 800 times the events of a gigabyte at 100 Gbit/s)."""
        if window_bound:
            self.send_off(nbytes, ack_at, now)
            return
        for _, flown in self.flights:
            self.acked(flown, now)
        self.flights = []
        self.acked(nbytes, now)

    def in_flight(self, now: float) -> float:
        """The bytes still in flight as a round opens at `now`, those due acknowledged: on
        a clean path with one flow. Elsewhere every flight counts as acknowledged (flows
        of one pair take turns at its window; lossy connections keep windows of their
        own)."""
        if self.active == 1 and not self.lossy:
            return self.land(now)
        for _, nbytes in self.flights:
            self.acked(nbytes, now)
        self.flights = []
        return 0.0

    def land(self, now: float) -> float:
        """Acknowledge the flights due by `now`; the bytes still in flight."""
        out, left = 0.0, []
        for at, nbytes in self.flights:
            if at <= now:
                self.acked(nbytes, at)
            else:
                left.append((at, nbytes))
                out += nbytes
        self.flights = left
        return out

    def __post_init__(self) -> None:
        self.base_rtt = self.rtt
        self.buffers = self.window
        self.held = in_flight_under_loss(self.buffers, self.loss)

    def begin(self, now: float) -> None:
        """Linux's restart after idle: the window halves for every RTO the pair sat idle,
        down to the initial window (tcp_cwnd_restart)."""
        if self.flights:
            self.land(now)
        if self.active == 0 and self.ssthresh != math.inf:
            self.epoch += now - self.last_active
        if self.active == 0 and self.restart_after_idle:
            idle = now - self.last_active
            rto = self.rto_min + self.rtt
            if idle > rto and self.ssthresh != math.inf:  # tcp_cwnd_restart
                self.ssthresh = max(self.ssthresh, RESTART_THRESHOLD * self.cwnd)
            self.cwnd = _restarted(self.cwnd, idle, rto)
            if self.cycles:
                for cycle in self.cycles:
                    cycle.cwnd = _restarted(cycle.cwnd, idle, rto)
                self.cwnd = self._mean_window()
        self.active += 1

    def restart_window(self) -> None:
        """After an outage TCP has timed out: every connection from the initial window (and
        the message is dealt again from what is left)."""
        self.cwnd = INITIAL_WINDOW
        self.stripes = None
        self.flights = []
        for cycle in self.cycles:
            cycle.cwnd = INITIAL_WINDOW

    def end(self, now: float) -> None:
        self.active -= 1
        self.last_active = now
        if not self.active:
            self.stripes = None

    def round_budget(self) -> float:
        """Bytes one flow of this pair may send in a round."""
        return self.connections * min(self.cwnd, self.window) / max(1, self.active)

    def open_round(self, remaining: float, size: float) -> float:
        """The bytes a round lets the pair's one flow send, with `remaining` of its message
        of `size` bytes unsent. Where its connections' windows are one, that is their
        sum. On a lossy path each has its own, and the message rides them as the
        transport deals it (testbed.plan.striping): each connection takes
        CHUNKS_AT_START pieces as it starts, and the next piece whenever what it holds
        falls short of its window, in turn; each sends what it holds, up to its window.
        So a connection slowed by an early loss keeps the pieces it took, and the message
        waits for them."""
        if self.connections == 1 or self.active != 1 or not self.lossy:
            self.stripes = None
            return self.round_budget()
        cycles = self._loss_cycles()
        stripes = self.stripes
        if stripes is None:
            chunk = float(chunk_bytes(math.ceil(size), self.connections))
            stripes = self.stripes = Stripes(chunk, [0.0] * self.connections)
            unassigned = remaining
            for _ in range(CHUNKS_AT_START):
                unassigned = stripes.deal(unassigned, lambda _i: True)
        else:
            unassigned = remaining - sum(stripes.taken)
        taken = stripes.taken
        while unassigned > 0.0:
            left = stripes.deal(unassigned, lambda i: taken[i] < cycles[i].cwnd)
            if left == unassigned:
                break
            unassigned = left
        stripes.sends = [min(cycle.cwnd, held) for cycle, held in zip(cycles, taken,
                                                                      strict=True)]
        stripes.window = self.round_budget()
        return sum(stripes.sends)

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
        at every K), and a flow's weight never depends on which others are under way.
        The round trip includes the bottleneck's standing queue (`standing_queue_s`), as
        the flows sharing it all see it."""
        weight = self.connections / max(1, self.active)
        if not self.rtt_bias:
            return weight
        bias: float = ((self.base_rtt + self.standing_queue_s) / self.rto_min) \
            ** -self.rtt_bias
        return weight * bias

    @property
    def lossy(self) -> bool:
        """Whether random loss on its path sets its window, round by round, until every
        connection's loss cycle settles."""
        return self.response is not None and self.loss > 0.0 and not self.settled

    def set_loss(self, loss: float) -> None:
        """The path's loss for its next message: a new rate starts settled loss cycles
        anew, and no loss ends them."""
        if loss == self.loss:
            return
        if self.settled or loss <= 0.0:
            self.settled, self.window, self.cycles = False, self.buffers, []
        self.loss = loss
        self.held = in_flight_under_loss(self.buffers, loss)

    def tail_wait(self, last_round_bytes: float) -> float:
        """How much later, on average, a message's last byte arrives on a lossy path than
        on a clean one, whatever the congestion control. A lost segment is sent again
        once a segment sent after it is acknowledged, a round trip after its own send
        (RACK, RFC 8985): a loss among the `last_round_bytes` the message sent in its last
        round trip holds its last byte up by that round trip less the time from the loss
        to the end of sending, the latest such loss counting. Losses come at random (a
        Poisson process over the x packets of that round trip): RTT (1 - (1 - e^-x) / x)
        on average. A connection's last packet has none sent after it: once the packet
        before it is acknowledged it is alone in flight, and the tail loss probe then
        waits two round trips plus the worst delayed ACK (RFC 8985's PTO for one segment
        in flight, Linux's minimum RTO for that ACK), longer than the retransmission
        timeout, so the probe goes when that is due (tcp_schedule_loss_probe takes the
        earlier; the minimum RTO and a round trip, as the restart after idle counts
        it): where any of the pair's connections loses its last packet, the message
        waits that much longer than the round trip RACK would take."""
        if self.loss <= 0.0:
            return 0.0
        packets = self.loss * last_round_bytes / MSS
        rack = 1.0 + math.expm1(-packets) / packets if packets > 1e-9 else packets / 2
        last = 1.0 - (1.0 - self.loss) ** self.connections
        return rack * self.rtt + last * (self.rto_min + self.rtt)

    def acked(self, nbytes: float, now: float = 0.0) -> None:
        """Slow start: every byte acknowledged grows the window by a byte (so a window
        used in full doubles per RTT), up to the socket buffers' limit. On a lossy path
        each connection keeps its own window (LossCycle) and is acknowledged what it sent
        of the round: what `open_round` had it send of the pieces it holds, or, without
        pieces (several flows on the pair), a share in proportion to its window."""
        if not self.lossy:
            # past its buffers' window only on a path that never had loss cycles
            limit = self.window if self.cycles else CWND_OF_FLIGHT * self.window
            each = nbytes / self.connections
            if self.cwnd + each <= self.ssthresh:
                self.cwnd = min(limit, self.cwnd + each)
                return
            self.cwnd = past_threshold(self, self.cwnd, each, now)
            return
        assert self.response is not None
        cycles = self._loss_cycles()
        if self.stripes is not None:
            sent = self.stripes.sent(nbytes)
        else:
            total = sum(cycle.cwnd for cycle in cycles)
            sent = [nbytes * (cycle.cwnd / total) for cycle in cycles]
        for cycle, each in zip(cycles, sent, strict=True):
            cycle.carried += each
            if not cycle.settled:
                cycle.acked(each, now, self.response, self.loss, self.window, self.held,
                            self.rtt)
        self.cwnd = self._mean_window()
        if all(cycle.settled for cycle in cycles):
            self.settled, self.window = True, self.cwnd

    def cut(self, now: float, in_flight: float) -> bool:
        """A full drop-tail queue's loss, `in_flight` bytes per connection out when it came
        (its share of what the link holds): the window drops to the congestion control's
        beta of it and becomes the threshold every later slow start ends at (RFC 5681,
        RFC 8312; with CUBIC's fast convergence, a W_max below the last one is lowered
        further). Once a round trip at most (a loss recovery's), on a clean path, for a
        control that cuts at a loss; False where it did not cut."""
        if not self.cuts(now):
            return False
        assert self.response is not None
        window = min(in_flight, self.window, self.cwnd)
        if window <= 0.0:
            return False
        beta = self.response.beta
        self.w_max = window * (1 + beta) / 2 if window < self.w_max else window
        self.ssthresh = self.cwnd = max(2 * MSS, beta * window)
        self.epoch = self.cut_at = now
        return True

    def cuts(self, now: float) -> bool:
        """Whether a loss now would cut its window (`cut`)."""
        return cuts_at_loss(self.response) and not self.lossy and now >= self.cut_at + self.rtt

    def _loss_cycles(self) -> list[LossCycle]:
        """Its connections' windows on a lossy path, each from the pair's window as its
        first lossy round starts."""
        if not self.cycles:
            self.cycles = [LossCycle(min(self.cwnd, self.window), first) for first in
                           first_losses(self.connections)]
        return self.cycles

    def _mean_window(self) -> float:
        return sum(cycle.cwnd for cycle in self.cycles) / len(self.cycles)


def past_threshold(pair: Pair, cwnd: float, each: float, now: float) -> float:
    """A clean-path window `cwnd` once `each` bytes per connection are acknowledged at `now`
    where that takes it past the pair's threshold: slow start up to it, then the window
    grows as its congestion control grows one after a loss (LossResponse.window_after, from
    `w_max` at `epoch`), no faster than slow start would, and only up to what its buffers
    keep in flight (past that it is not the window that limits it)."""
    assert pair.response is not None
    start = pair.ssthresh if cwnd < pair.ssthresh else cwnd
    left = each - (start - cwnd)
    target = pair.response.window_after(now - pair.epoch, pair.rtt, pair.w_max)
    return min(pair.window, max(start, min(target, start + left)))


def _restarted(cwnd: float, idle: float, rto: float) -> float:
    """A window after `idle` seconds without sending: halved per RTO, down to the initial
    window."""
    while idle > rto and cwnd > INITIAL_WINDOW:
        cwnd = max(INITIAL_WINDOW, cwnd / 2)
        idle -= rto
    return cwnd


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
    slowest = topology.bottlenecks(src_dc, dst_dc)
    window = in_flight_bytes(src, dst, slowest[0].bandwidth_bps if slowest else math.inf)
    return Pair(connections, window, max(rtt, MIN_RTT_S),
                restarts_after_idle(src.congestion, src.slow_start_after_idle),
                src.rto_min_s or RTO_MIN, pacing,
                rtt_bias(src.congestion, pacing), loss_response(src.congestion), loss,
                sawtooth_cv(src.congestion),
                STANDING_QUEUE * max((link.queue_s for link in slowest), default=0.0),
                PACING_SHARE * slowest[0].bandwidth_bps if pacing and slowest else math.inf)


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
    steady_bytes: float = 0.0
    """What it had left to send as it became steady: acknowledged at its end (Pair.acked)."""
    round_end: float = float("inf")
    coasting: bool = False
    """Its rounds from `round_end` on are plain (testbed.sim.coast) and run implicitly, each
    when something reads the flow, none by an event of its own."""
    coast_id: int = 0
    """Tells a coast's last event from an earlier coast's."""
    share: float = 1.0
    """Times its pair's weight: this message's draw of the share noise
    (testbed.plan.jitter), 1 without it..."""
    draw: Callable[[], float] | None = None
    """... made by this the first time its weight is read (Share)."""
    round_ack: float = float("inf")
    """When its round's bytes are acknowledged: a round trip after it opened."""

    def weight(self) -> float:
        if self.draw is not None:
            self.share, self.draw = self.draw(), None
        return self.pair.weight() * self.share

    def progress(self, now: float) -> None:
        sent = self.rate / 8 * (now - self.updated)
        remaining, budget = self.remaining - sent, self.budget - sent
        # max(0.0, x) written out: the hottest lines of a run
        self.remaining = remaining if remaining > 0.0 else 0.0
        self.budget = budget if budget > 0.0 else 0.0
        self.updated = now


def last_round_bytes(flow: Flow, rate: float) -> float:
    """What the flow sent in its last round trip: its round's window while its window
    grows, its rate (bit/s) times the round trip once steady; no more than its message."""
    if flow.steady:
        sent = rate / 8 * flow.pair.rtt
    else:  # the windows', also where a striped message's last pieces fill fewer
        stripes = flow.pair.stripes
        sent = flow.round_budget if stripes is None else stripes.window
    return min(sent, flow.size)


def cap(flow: Flow) -> float:
    """bit/s the flow may not exceed whatever the links leave it: window per RTT once
    steady, a multiple of its round's window while paced, none otherwise."""
    pair = flow.pair
    if flow.steady or (pair.lossy and pair.cwnd >= pair.window):
        return pair.steady_cap()
    return pair.paced_cap() if pair.paced else float("inf")
