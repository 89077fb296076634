"""The standing queue at a saturated WAN link, and the wait it adds to the round trips of
the flows that cross it without being held there (testbed.sim.network). Pure.

A flow held back by a link's share keeps its whole window in flight: what the path's
round trip does not hold of it waits in the link's drop-tail queue (a window beyond the
bandwidth-delay product queues its excess at the bottleneck: Dordal, "An Introduction to
Computer Networks", sliding windows), unless the pairs held there are paced below what
it drains together (one pair alone: testbed.plan.pacing.PACING_SHARE of its rate). The
flows the link holds back lose nothing by it (their share sets their pace), but every
other flow through the link, data one way or acknowledgements the other, waits there
too: a window-limited flow whose acknowledgements come back through a queue that a
link's shorter flows keep standing moves one window per round trip plus that wait.
Where the windows held there outgrow the queue, loss-based flows overflow it, cut back
and fill it again, and it holds STANDING_QUEUE of itself on average. Only loss-based
flows keep one: BBR paces at its estimate of the bottleneck's rate and drains what its
probes queue.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from testbed.plan.tcp_model import PAYLOAD_EFFICIENCY, STANDING_QUEUE, cuts_at_loss
from testbed.sim.flows import Flow, Pair, cap

SATURATED = 1.0 - 1e-9
"""A link whose flows' rates sum to this share of its capacity is full (float residue)."""
PASSES = 4
"""Standing queues retime pairs at most this many times in one instant: a retimed pair's
flows share anew, which moves the queues again (they settle by the next event)."""
STEP = 0.01
"""A change of a pair's wait under this share of its round trip leaves the round trip as it
was: every round of a slow start held at a link moves that link's queue."""


@dataclass(frozen=True)
class Standing:
    """One link direction's standing queue."""

    delay_s: float
    """How long a byte waits in it."""
    holders: frozenset[int]
    """The pairs (by id) whose flows the link holds back, whose windows keep it standing:
    it adds nothing to their round trips (their share, not their window, sets their
    pace)."""
    overflowing: bool = False
    """Their windows outgrow the queue: they lose packets there (Pair.cut)."""


def reverse(resource: str) -> str:
    """The other direction of a WAN link's resource (`wan:a>b` to `wan:b>a`): the path of a
    flow's acknowledgements, routes being symmetric."""
    a, b = resource[4:].split(">")
    return f"wan:{b}>{a}"


def excess_bytes(flow: Flow, rate: float) -> float:
    """What the flow keeps in flight (its round's window, or once steady its share of its
    pair's window) beyond what its round trip holds at `rate` (bit/s)."""
    pair = flow.pair
    window = pair.connections * pair.window / max(1, pair.active) if flow.steady \
        else flow.round_budget
    return window - rate / 8 * pair.rtt


def standing_queues(flows: Iterable[Flow], rates: Mapping[int, float],
                    capacity: Mapping[str, float], queue_bytes: Mapping[str, float],
                    links: Iterable[str]) -> dict[str, Standing]:
    """The standing queue of each of `links` (WAN directions with a queue in `queue_bytes`)
    where the `flows` on them (all of them) send at `rates` (bit/s; `capacity`: bit/s as
    the links carry it): the windows of the flows each one holds back (its first full
    link on the path, where their cap does not bind) less what their round trips hold,
    up to the queue; STANDING_QUEUE of the queue where they overflow it. Links with no
    queue standing are left out."""
    usable = {r: capacity[r] * PAYLOAD_EFFICIENCY for r in capacity}
    sums: dict[str, float] = {}
    for flow in flows:
        rate = rates.get(flow.id, 0.0)
        for resource in flow.resources:
            if resource in queue_bytes:
                sums[resource] = sums.get(resource, 0.0) + rate
    excess: dict[str, float] = {}
    holders: dict[str, set[int]] = {}
    offered: dict[str, float] = {}  # what the pairs held at each link may send together
    for flow in flows:
        rate = rates.get(flow.id, 0.0)
        if rate <= 0.0 or not cuts_at_loss(flow.pair.response) \
                or rate >= cap(flow) * SATURATED:
            continue  # not held by a link, or BBR
        held = next((r for r in flow.resources if r in sums
                     and sums[r] >= usable[r] * SATURATED), None)
        if held is None:
            continue
        queued = excess_bytes(flow, rate)
        if queued > 0.0:
            excess[held] = excess.get(held, 0.0) + queued
            if id(flow.pair) not in holders.setdefault(held, set()):
                holders[held].add(id(flow.pair))
                offered[held] = offered.get(held, 0.0) + flow.pair.pacing_bps
    out = {}
    for link in links:
        if link not in excess or offered[link] <= capacity[link]:
            continue
        full = queue_bytes[link]
        waiting = excess[link] if excess[link] <= full else STANDING_QUEUE * full
        out[link] = Standing(waiting * 8 / usable[link], frozenset(holders[link]),
                             excess[link] > full)
    return out


@dataclass
class StandingQueues:
    """The flow model's standing queues (testbed.sim.network.FluidNetwork's): each queued
    link's, and the flows under way that cross each, their bytes or acknowledgements. Its
    answers are pairs' new round trips (`Pair.rtt`: `base_rtt` and the wait, `queued_s`),
    for the network to set."""

    queue_bytes: dict[str, float] = field(default_factory=dict)
    """Drop-tail queue per WAN link direction, bytes; none: no queue is modeled."""
    standing: dict[str, Standing] = field(default_factory=dict)
    crossing: dict[str, set[int]] = field(default_factory=dict)
    passes: tuple[float, int] = (-1.0, 0)
    """(instant, how many times the queues retimed pairs in it)."""

    def links(self, flow: Flow) -> list[str]:
        """The queued links the flow's bytes cross, and those its acknowledgements do."""
        wan = [r for r in flow.resources if r in self.queue_bytes]
        return [*wan, *(back for r in reversed(wan) if (back := reverse(r)) in self.queue_bytes)]

    def enter(self, flow: Flow) -> list[tuple[Pair, float]]:
        """A flow starts: its pair's round trip where its wait moved."""
        pair = flow.pair
        links = pair.queued_links
        if links is None:  # a pair's flows share its path
            links = pair.queued_links = self.links(flow)
        if not links:
            return []
        for link in links:
            self.crossing.setdefault(link, set()).add(flow.id)
        if pair.queued_s or not self.standing.keys().isdisjoint(links):
            return self._retimed(flow)
        return []

    def touched(self, flow: Flow, rate: float, cap_bps: float) -> bool:
        """Whether a flow alone on its links, at `rate` under its cap, may change their
        standing queues: one stands there, or it may keep one (held there, a loss-based
        window beyond what its round trip holds, not paced below the link's rate)."""
        pair = flow.pair
        if not pair.queued_links:
            return False
        if self.standing and any(r in self.standing for r in flow.resources):
            return True
        return rate < cap_bps and pair.pacing_bps == math.inf \
            and cuts_at_loss(pair.response) and excess_bytes(flow, rate) > 0.0

    def leave(self, flow: Flow, users: Mapping[str, set[int]]) -> list[str]:
        """A flow ended: the links of its path whose standing queue no flow sends through
        any more (`users`: the flows on each resource, without it)."""
        for link in flow.pair.queued_links or ():
            self.crossing[link].discard(flow.id)
        return [r for r in flow.resources if r in self.standing and not users[r]]

    def update(self, now: float, flows: list[Flow], rates: Mapping[int, float],
               capacity: Mapping[str, float], resources: Iterable[str],
               under_way: Mapping[int, Flow]) -> list[tuple[Pair, float]]:
        """The standing queues of these resources, all of whose flows are `flows` sending
        at `rates` (`capacity`: bit/s per resource, as configured); the new round trips of
        the pairs of flows `under_way` (by id) that cross one that changed. None past
        PASSES in one instant: the queues that changed are then met as changed by the
        next solve."""
        links = [r for r in resources if r in self.queue_bytes]
        if not links:
            return []
        standing = standing_queues(flows, rates, {r: capacity[r] for r in links},
                                   self.queue_bytes, links)
        changed = sorted(r for r in links if standing.get(r) != self.standing.get(r))
        instant, passes = self.passes
        if not changed or (instant == now and passes >= PASSES):
            return []
        self.passes = (now, passes + 1 if instant == now else 1)
        for link in changed:
            if link in standing:
                self.standing[link] = standing[link]
            else:
                del self.standing[link]
        crossing = sorted({fid for r in changed for fid in self.crossing.get(r, ())})
        return [retimed for fid in crossing for retimed in self._retimed(under_way[fid])]

    def losses(self, flows: Iterable[Flow], rates: Mapping[int, float],
               capacity: Mapping[str, float]) -> list[tuple[Flow, float]]:
        """The flows a link whose queue overflows holds back (`Standing.overflowing`), each
        with the bytes per connection it has in flight as it loses a packet there: at a
        drop-tail queue's overflow, its share of what the link holds, its rate times its
        round trip and the full queue's wait (`capacity`: bit/s as configured)."""
        out: list[tuple[Flow, float]] = []
        if not any(queue.overflowing for queue in self.standing.values()):
            return out
        for flow in flows:
            rate = rates.get(flow.id, 0.0)
            held = next((r for r in flow.resources if (queue := self.standing.get(r))
                         and queue.overflowing and id(flow.pair) in queue.holders), None)
            if held is None or rate <= 0.0:
                continue
            pair = flow.pair
            full_s = self.queue_bytes[held] * 8 / (capacity[held] * PAYLOAD_EFFICIENCY)
            out.append((flow, rate / 8 * (pair.base_rtt + full_s) * max(1, pair.active)
                        / pair.connections))
        return out

    def _retimed(self, flow: Flow) -> list[tuple[Pair, float]]:
        """The pair's wait in the standing queues its flow (one of its own: they share a
        path) crosses where the pair is not held, set where it moved by STEP of its round
        trip or more; its round trip then."""
        pair, waiting = flow.pair, 0.0
        for link in pair.queued_links or ():
            queue = self.standing.get(link)
            if queue is not None and id(pair) not in queue.holders:
                waiting += queue.delay_s
        if abs(waiting - pair.queued_s) <= STEP * pair.base_rtt:
            return []
        pair.queued_s = waiting
        return [(pair, pair.base_rtt + waiting)]
