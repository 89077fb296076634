"""Flow-level network model: weighted max-min fair sharing of link capacity, TCP windows in
rounds of one RTT (slow start from ten segments; after idle, when the topology says so, the
window halves per RTO idle as Linux does; capped by the socket buffers), and propagation
delay. A transfer striped over N
connections is one flow of weight N whose window is N connections' worth.

Each round a flow may send one window of bytes at its fair share of the path; if it runs
out before the round (RTT) is over it pauses, and its share goes to others. So a transfer
smaller than a window leaves at line rate, one flow on a long link averages window/RTT,
and many flows fill the link. There is no loss: senders whose messages could overflow a queue
are paced (testbed.pacing), as the emulator's are, and within a round a paced flow sends
at most PACING_RATIO windows per RTT.
Pure: time is passed in, nothing sleeps.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.pacing import PACING_RATIO
from testbed.tcp_model import MSS as MSS
from testbed.tcp_model import PAYLOAD_EFFICIENCY as PAYLOAD_EFFICIENCY
from testbed.tcp_model import WINDOW_EFFICIENCY as WINDOW_EFFICIENCY

INITIAL_WINDOW = 10 * MSS
RTO_MIN = 0.2


def resume_after_outage(outage_s: float, rto_s: float) -> float:
    """When TCP sends again after a link was down `outage_s`: retransmissions back off,
    doubling from one RTO, so the first one after the link is back comes at the next
    point of rto x (2^k - 1)."""
    waited, step = 0.0, rto_s
    while waited < outage_s:
        waited += step
        step *= 2
    return waited


Schedule = Callable[[float, Callable[[float], None]], None]


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

    def progress(self, now: float) -> None:
        sent = self.rate / 8 * (now - self.updated)
        self.remaining = max(0.0, self.remaining - sent)
        self.budget = max(0.0, self.budget - sent)
        self.updated = now


@dataclass
class FluidNetwork:
    capacity: dict[str, float]
    """bit/s per resource: WAN link directions and host NICs."""
    schedule: Schedule
    flows: dict[int, Flow] = field(default_factory=dict)
    users: dict[str, set[int]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _dirty: set[str] = field(default_factory=set)
    """Resources whose flows changed at this instant and share anew at its end."""
    _flush_pending: bool = False

    def start(
        self,
        now: float,
        nbytes: float,
        resources: tuple[str, ...],
        pair: Pair,
        latency: float,
        on_arrival: Callable[[float], None],
        on_sent: Callable[[float], None] | None = None,
    ) -> None:
        """Send `nbytes`; `on_sent(t)` runs when the last byte has left, `on_arrival(t)` when
        it reaches the receiver."""
        pair.begin(now)
        if nbytes <= 0:
            pair.end(now)
            if on_sent is not None:
                on_sent(now)
            self.schedule(now + latency, on_arrival)
            return
        flow = Flow(
            next(self._ids),
            resources,
            pair,
            latency,
            on_arrival,
            float(nbytes),
            updated=now,
            on_sent=on_sent,
        )
        self.flows[flow.id] = flow
        for resource in resources:
            self.users.setdefault(resource, set()).add(flow.id)
        self._new_round(now, flow)

    def set_capacity(self, now: float, resource: str, bps: float) -> None:
        """A link changed during the run (a network event): flows on it share anew."""
        self.capacity[resource] = bps
        self._reallocate(now, (resource,))

    def restart_windows(self, now: float, resource: str) -> None:
        """After an outage TCP has timed out: every flow on `resource` starts again from
        the initial window."""
        for fid in list(self.users.get(resource, ())):
            flow = self.flows[fid]
            flow.progress(now)
            flow.pair.cwnd = INITIAL_WINDOW
            flow.steady = False
            self._new_round(now, flow)

    def _new_round(self, now: float, flow: Flow) -> None:
        """Slow start goes in rounds of one RTT; once the window reaches the socket
        buffers' limit the flow is steady and simply capped at window/RTT."""
        pair = flow.pair
        flow.paused = False
        flow.scheduled = False  # the window changed: its next event must be recomputed
        if pair.cwnd >= pair.window:
            flow.steady = True
            flow.budget = flow.round_budget = float("inf")
        else:
            flow.round_id += 1
            flow.budget = flow.round_budget = pair.round_budget()
            self.schedule(
                now + pair.rtt,
                functools.partial(self._round_over, flow=flow, round_id=flow.round_id),
            )
        self._reallocate(now, flow.resources)

    def _round_over(self, now: float, flow: Flow, round_id: int) -> None:
        if flow.id not in self.flows or flow.round_id != round_id:
            return
        flow.progress(now)
        flow.pair.acked(flow.round_budget - flow.budget)
        self._new_round(now, flow)

    def _event(self, now: float, flow_id: int, version: int) -> None:
        """A flow ran out of bytes or out of this round's window."""
        flow = self.flows.get(flow_id)
        if flow is None or flow.version != version:
            return
        flow.scheduled = False
        flow.progress(now)
        # the event was for whichever ran out first; float residue must not leave a flow
        # paused with bytes to send and an unspent window
        if flow.remaining <= 1e-3 or flow.budget > 1e-3:
            if not flow.steady:
                flow.pair.acked(flow.round_budget - flow.budget)
            del self.flows[flow_id]
            for resource in flow.resources:
                self.users[resource].discard(flow_id)
            flow.pair.end(now)
            self._reallocate(now, flow.resources)
            self.schedule(now + flow.latency, flow.on_arrival)
            if flow.on_sent is not None:
                flow.on_sent(now)
        else:
            flow.paused = True
            self._reallocate(now, flow.resources)

    def _component(self, resources: tuple[str, ...]) -> tuple[list[Flow], set[str]]:
        """Flows and resources coupled to these resources through shared flows."""
        flows: dict[int, Flow] = {}
        seen: set[str] = set()
        todo = list(resources)
        while todo:
            resource = todo.pop()
            if resource in seen:
                continue
            seen.add(resource)
            for fid in self.users.get(resource, ()):
                if fid not in flows:
                    flows[fid] = self.flows[fid]
                    todo.extend(flows[fid].resources)
        return list(flows.values()), seen

    def _reallocate(self, now: float, resources: tuple[str, ...]) -> None:
        """Flows on these resources changed: they share anew once every event of this
        instant has run (no time passes within an instant, so no flow's progress depends
        on when in it the shares are solved), each coupled component once."""
        self._dirty.update(resources)
        if not self._flush_pending:
            self._flush_pending = True
            self.schedule(now, self._flush)

    def _flush(self, now: float) -> None:
        self._flush_pending = False
        dirty, self._dirty = self._dirty, set()
        solved: set[str] = set()
        for resource in sorted(dirty):  # sorted: the same order whatever the hash seed
            if resource not in solved:
                solved |= self._solve(now, (resource,))

    def _solve(self, now: float, resources: tuple[str, ...]) -> set[str]:
        """New rates for every flow coupled to these resources; the resources solved."""
        flows, seen = self._component(resources)
        for flow in flows:
            flow.progress(now)
        sending = [f for f in flows if not f.paused]
        rates = max_min(
            {
                f.id: (
                    f.pair.connections / max(1, f.pair.active),
                    f.pair.steady_cap() if f.steady
                    else f.pair.paced_cap() if f.pair.paced else float("inf"),
                    f.resources,
                )
                for f in sending
            },
            {r: self.capacity[r] * PAYLOAD_EFFICIENCY for r in seen},
        )
        for flow in flows:
            rate = rates.get(flow.id, 0.0)
            if rate == flow.rate and flow.rate > 0 and flow.scheduled:
                continue  # its pending event is still right
            flow.rate = rate
            flow.version += 1
            flow.scheduled = flow.rate > 0
            if flow.rate > 0:
                left = min(flow.remaining, flow.budget)
                done = now + left * 8 / flow.rate
                self.schedule(
                    done, functools.partial(self._event, flow_id=flow.id, version=flow.version)
                )
        return seen


def max_min(
    flows: dict[int, tuple[float, float, tuple[str, ...]]], capacity: dict[str, float]
) -> dict[int, float]:
    """Weighted max-min fair rates by progressive filling: flow -> (weight, cap, resources).
    Each round raises every unfrozen flow's rate per unit weight until a resource fills up
    or a flow reaches its cap; those flows freeze."""
    rates: dict[int, float] = {}
    left = dict(capacity)
    weights: dict[str, float] = {}
    users: dict[str, list[int]] = {}
    for fid, (weight, _, resources) in flows.items():
        for resource in resources:
            weights[resource] = weights.get(resource, 0.0) + weight
            users.setdefault(resource, []).append(fid)
    active = dict(flows)
    while active:
        level, bottleneck = float("inf"), None
        for resource, weight in weights.items():
            if weight > 1e-12 and left[resource] / weight < level:
                level, bottleneck = left[resource] / weight, resource
        capped = [fid for fid, (w, cap, _) in active.items() if cap / w <= level]
        if capped:
            frozen = [(fid, active[fid][1]) for fid in capped]
        elif bottleneck is not None:
            frozen = [(fid, level * active[fid][0]) for fid in users[bottleneck] if fid in active]
        else:
            break
        for fid, rate in frozen:
            rates[fid] = rate
            weight, _, resources = active.pop(fid)
            for resource in resources:
                left[resource] = max(0.0, left[resource] - rate)
                weights[resource] -= weight
    for fid in active:
        rates[fid] = 0.0
    return rates
