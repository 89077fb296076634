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
    round_end: float = float("inf")

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
        self._open_round(now, flow)
        self._share(now, flow)

    def _open_round(self, now: float, flow: Flow) -> None:
        pair = flow.pair
        flow.paused = False
        flow.scheduled = False  # the window changed: its next event must be recomputed
        if pair.cwnd >= pair.window:
            flow.steady = True
            flow.budget = flow.round_budget = flow.round_end = float("inf")
        else:
            flow.round_id += 1
            flow.budget = flow.round_budget = pair.round_budget()
            flow.round_end = now + pair.rtt
            self.schedule(
                flow.round_end,
                functools.partial(self._round_over, flow=flow, round_id=flow.round_id),
            )

    def _round_over(self, now: float, flow: Flow, round_id: int) -> None:
        """A round ended. A flow still sending at a rate its cap did not set, before and
        after, leaves every share as it was (max-min shares depend on a cap only where it
        binds): it reschedules only its own event. Otherwise its component shares anew."""
        if flow.id not in self.flows or flow.round_id != round_id:
            return
        flow.progress(now)
        old_cap = _cap(flow)
        flow.pair.acked(flow.round_budget - flow.budget)
        sending = not flow.paused and flow.rate > 0 and flow.pair.active == 1
        self._open_round(now, flow)
        if sending and flow.rate < min(old_cap, _cap(flow)):
            self._schedule_event(now, flow)
        else:
            self._share(now, flow)

    def _share(self, now: float, flow: Flow) -> None:
        """The flow's rate changed: a flow alone on its links takes at once what max_min
        would give it (its cap or its slowest link); otherwise its component shares anew."""
        if any(len(self.users[r]) > 1 for r in flow.resources):
            self._reallocate(now, flow.resources)
            return
        rate = 0.0 if flow.paused else min(
            _cap(flow), *(self.capacity[r] * PAYLOAD_EFFICIENCY for r in flow.resources))
        self._set_rate(now, flow, rate)

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
            shared = tuple(r for r in flow.resources if self.users[r])
            if shared:  # the flows left on its links share anew
                self._reallocate(now, shared)
            self.schedule(now + flow.latency, flow.on_arrival)
            if flow.on_sent is not None:
                flow.on_sent(now)
        else:
            flow.paused = True
            self._share(now, flow)

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
            {f.id: (f.pair.connections / max(1, f.pair.active), _cap(f), f.resources)
             for f in sending},
            {r: self.capacity[r] * PAYLOAD_EFFICIENCY for r in seen},
        )
        for flow in flows:
            self._set_rate(now, flow, rates.get(flow.id, 0.0))
        return seen

    def _set_rate(self, now: float, flow: Flow, rate: float) -> None:
        if rate == flow.rate and rate > 0 and flow.scheduled:
            return  # its pending event is still right
        flow.rate = rate
        if rate > 0:
            self._schedule_event(now, flow)
        else:
            flow.version += 1
            flow.scheduled = False

    def _schedule_event(self, now: float, flow: Flow) -> None:
        """The flow's one pending event: when it runs out of bytes or of its round's window
        at its rate (an earlier one, now stale, is ignored by version). None if the round
        ends first: its end decides anew."""
        flow.version += 1
        flow.scheduled = True
        done = now + min(flow.remaining, flow.budget) * 8 / flow.rate
        if done > flow.round_end:
            return
        self.schedule(done, functools.partial(self._event, flow_id=flow.id, version=flow.version))


def _cap(flow: Flow) -> float:
    """bit/s the flow may not exceed whatever the links leave it: window per RTT once
    steady, a multiple of its round's window while paced, none otherwise."""
    pair = flow.pair
    if flow.steady:
        return pair.steady_cap()
    return pair.paced_cap() if pair.paced else float("inf")


def max_min(
    flows: dict[int, tuple[float, float, tuple[str, ...]]], capacity: dict[str, float]
) -> dict[int, float]:
    """Weighted max-min fair rates: flow -> (weight, cap, resources). A resource only one
    flow uses is a cap on that flow; flows then alike (weight, cap, shared resources: the
    data-parallel replicas of one transfer, on their own NICs) are solved once, as a group,
    so the cost follows the distinct flows, not their number."""
    users: dict[str, int] = {}
    for _, _, resources in flows.values():
        for resource in resources:
            users[resource] = users.get(resource, 0) + 1
    groups: dict[tuple[float, float, tuple[str, ...]], list[int]] = {}
    for fid, (weight, cap, resources) in flows.items():
        for resource in resources:
            if users[resource] == 1:
                cap = min(cap, capacity[resource])
        shared = tuple(r for r in resources if users[r] > 1)
        groups.setdefault((weight, cap, shared), []).append(fid)
    keys = list(groups)
    group_rates = _fill({g: (*key, len(groups[key])) for g, key in enumerate(keys)}, capacity)
    return {fid: group_rates[g] for g, key in enumerate(keys) for fid in groups[key]}


def _fill(
    groups: dict[int, tuple[float, float, tuple[str, ...], int]], capacity: dict[str, float]
) -> dict[int, float]:
    """Progressive filling over groups of `count` identical flows: every unfrozen flow's
    rate per unit weight rises until a resource fills up or a flow reaches its cap; those
    flows freeze. The rate of one flow of each group."""
    rates: dict[int, float] = {}
    left = dict(capacity)
    weights: dict[str, float] = {}
    users: dict[str, list[int]] = {}
    for gid, (weight, _, resources, count) in groups.items():
        for resource in resources:
            weights[resource] = weights.get(resource, 0.0) + weight * count
            users.setdefault(resource, []).append(gid)
    active = dict(groups)
    while active:
        level, bottleneck = float("inf"), None
        for resource, weight in weights.items():
            if weight > 1e-12 and left[resource] / weight < level:
                level, bottleneck = left[resource] / weight, resource
        capped = [gid for gid, (w, cap, _, _) in active.items() if cap / w <= level]
        if capped:
            frozen = [(gid, active[gid][1]) for gid in capped]
        elif bottleneck is not None:
            frozen = [(gid, level * active[gid][0]) for gid in users[bottleneck]
                      if gid in active]
        else:
            break
        for gid, rate in frozen:
            rates[gid] = rate
            weight, _, resources, count = active.pop(gid)
            for resource in resources:
                left[resource] = max(0.0, left[resource] - rate * count)
                weights[resource] -= weight * count
    for gid in active:
        rates[gid] = 0.0
    return rates
