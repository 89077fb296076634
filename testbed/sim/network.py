"""Flow-level network model: weighted max-min fair sharing of link capacity, TCP windows in
rounds of one RTT (slow start from ten segments; after idle, when the topology says so, the
window halves per RTO idle as Linux does; capped by the socket buffers), and propagation
delay. A transfer striped over N connections is one flow of weight N whose window is N
connections' worth.

Each round a flow may send one window of bytes at its fair share of the path; if it runs
out before the round (RTT) is over it pauses, and its share goes to others. So a transfer
smaller than a window leaves at line rate, one flow on a long link averages window/RTT,
and many flows fill the link. A flow's weight falls with its round trip as its congestion
control's does (testbed.plan.tcp_model.RTT_BIAS), the standing part of its bottleneck's
queue counted in that round trip (STANDING_QUEUE). A queue that flows a link holds back
keep standing delays the other flows through it, either way (testbed.sim.queues: their
round trips, not their weights); windows that outgrow it lose packets there, and each
loss-based pair keeps the threshold its loss sets (testbed.sim.flows.Pair.cut). Senders
whose messages could overflow one are paced (testbed.plan.pacing), as the emulator's are,
and within a round a paced flow sends at most PACING_RATIO windows per RTT; random loss
sets a loss-based flow's window as Reno or CUBIC would (testbed.sim.flows.Pair.acked).
Rounds that change nothing but the window run without events of their own (`_coast`),
to the same results. Pure: time is passed in, nothing sleeps.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from testbed.plan.tcp_model import MSS as MSS
from testbed.plan.tcp_model import PAYLOAD_EFFICIENCY as PAYLOAD_EFFICIENCY
from testbed.plan.tcp_model import WINDOW_EFFICIENCY as WINDOW_EFFICIENCY
from testbed.sim.coast import LOOKAHEAD, catch_up, plain_round, run_round, state_of
from testbed.sim.flows import INITIAL_WINDOW as INITIAL_WINDOW
from testbed.sim.flows import RTO_MIN as RTO_MIN
from testbed.sim.flows import Flow, Share, cap, last_round_bytes
from testbed.sim.flows import Pair as Pair
from testbed.sim.levels import Levels
from testbed.sim.max_min import max_min as max_min
from testbed.sim.queues import SATURATED, StandingQueues

Schedule = Callable[[float, Callable[[float], None]], None]


@dataclass
class FluidNetwork:
    capacity: dict[str, float]
    """bit/s per resource: WAN link directions and host NICs."""
    schedule: Schedule
    flows: dict[int, Flow] = field(default_factory=dict)
    users: dict[str, set[int]] = field(default_factory=dict)
    _ids: itertools.count[int] = field(default_factory=itertools.count)
    _of_pair: dict[int, set[int]] = field(default_factory=dict)
    """The flows under way of each pair (by the pair's id): a flow starting or ending
    changes what each of the others may take of the pair's window and weight."""
    _dirty: set[str] = field(default_factory=set)
    """Resources whose flows changed at this instant and share anew at its end."""
    _flush_pending: bool = False
    coast: bool = True
    """Run plain rounds of slow start without events of their own (`_coast`); off, every
    round has its event (the same results to the bit, more events)."""
    incremental_from: int = 16
    """A component solved with at least this many flows keeps its shares from event to
    event where they have testbed.sim.levels' simple form (the same rule, to float
    precision, at log n a flow instead of a solve of the component per event) and its
    flows' next events mostly differ (`_keep`); smaller components, components in
    lockstep, and any that leaves the form, are solved whole. Below about this many
    flows a whole solve costs what keeping them does."""
    _kept: dict[str, Levels] = field(default_factory=dict)
    """The kept shares by each resource they cover (none covers another's)."""
    queues: StandingQueues = field(default_factory=StandingQueues)
    """Where flows a link holds back keep its queue standing, the others through it wait
    there (testbed.sim.queues); with no queue given, none is modeled."""

    def start(
        self,
        now: float,
        nbytes: float,
        resources: tuple[str, ...],
        pair: Pair,
        latency: float,
        on_arrival: Callable[[float], None],
        on_sent: Callable[[float], None] | None = None,
        share: Share = 1.0,
    ) -> None:
        """Send `nbytes`; `on_sent(t)` runs when the last byte has left, `on_arrival(t)` when
        it reaches the receiver; `share` times its pair's weight (Flow.share, or what draws
        it: Flow.draw)."""
        if pair.coaster is not None:  # its share of the pair's window changes
            self._settle(now, pair.coaster)
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
            size=float(nbytes),
            updated=now,
            on_sent=on_sent,
            share=1.0 if callable(share) else share,  # a number (an int too) is the share
            draw=share if callable(share) else None,
        )
        self.flows[flow.id] = flow
        for resource in resources:
            self.users.setdefault(resource, set()).add(flow.id)
        siblings = self._of_pair.setdefault(id(pair), set())
        siblings.add(flow.id)
        if self.queues.queue_bytes and (pair.queued_links is None or pair.queued_links):
            for retimed, rtt in self.queues.enter(flow):
                self._set_rtt(now, retimed, rtt, queued=True)
        self._open_round(now, flow)
        if not self._kept or not self._join(now, flow):
            self._share(now, flow)
        if len(siblings) > 1:
            self._pair_changed(now, flow)

    def remaining(self, now: float) -> dict[int, float]:
        """Bytes each flow still has to send at `now`, by flow id (in start order)."""
        left = {}
        for fid, flow in self.flows.items():
            levels = self._kept.get(flow.resources[0])
            if levels is not None and levels.holds(fid):
                left[fid] = levels.remaining(fid, now)
            else:
                self._settle(now, flow)
                flow.progress(now)
                left[fid] = flow.remaining
        return left

    def set_capacity(self, now: float, resource: str, bps: float) -> None:
        """A link changed during the run (a network event): flows on it share anew."""
        if resource in self._kept:
            self._release(now, self._kept[resource])
        self.capacity[resource] = bps
        self._reallocate(now, (resource,))

    def restart_windows(self, now: float, resource: str) -> None:
        """After an outage TCP has timed out: every flow on `resource` starts again from
        the initial window."""
        if resource in self._kept:
            self._release(now, self._kept[resource])
        for fid in list(self.users.get(resource, ())):
            flow = self.flows[fid]
            self._settle(now, flow, inclusive=False)  # its round ending now would come after
            flow.progress(now)
            if not flow.steady:  # what the round the outage cut short sent, its windows saw
                flow.pair.send_off(flow.round_budget - flow.budget, flow.round_ack, now)
            flow.pair.restart_window()
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
        pending = pair.in_flight(now) if pair.flights else 0.0
        if pair.cwnd >= pair.window and not pair.lossy:
            flow.steady = True
            flow.steady_bytes = flow.remaining
            flow.budget = flow.round_budget = flow.round_end = float("inf")
        else:
            flow.round_id += 1
            flow.budget = flow.round_budget = pair.open_round(flow.remaining, flow.size)
            flow.round_end = flow.round_ack = now + pair.rtt
            if pending:  # the window less the bytes in flight, until the first of them
                flow.budget = flow.round_budget = max(0.0, flow.round_budget - pending)
                flow.round_end = min(at for at, _ in pair.flights)
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
        levels = self._kept.get(flow.resources[0])
        if levels is not None:
            if levels.holds(flow.id):
                self._kept_round_over(now, flow, levels)
                return
            # paused: its next round joins the kept shares
            flow.progress(now)
            flow.pair.send_off(flow.round_budget - flow.budget, flow.round_ack, now)
            self._open_round(now, flow)
            if not self._join(now, flow):
                self._share(now, flow)
            return
        if self.coast and not flow.paused and flow.rate > 0 and flow.pair.active == 1 \
                and not flow.pair.flights and self._coast(now, flow):
            return
        flow.progress(now)
        if not flow.rate and any(not self.capacity[r] for r in flow.resources):
            return  # its link is down: no round passes until `restart_windows` opens one
            # (an outage of days would otherwise be billions of empty rounds)
        old_cap = cap(flow)
        flow.pair.round_over(flow.round_budget - flow.budget, flow.round_ack, now,
                             window_bound=flow.paused)
        sending = not flow.paused and flow.rate > 0 and flow.pair.active == 1
        self._open_round(now, flow)
        if sending and flow.rate < min(old_cap, cap(flow)):
            self._schedule_event(now, flow)
        else:
            self._share(now, flow)

    def _kept_round_over(self, now: float, flow: Flow, levels: Levels) -> None:
        """A round of a flow whose shares are kept ended: the next opens, as
        `_round_over` opens it, and the kept shares take its new window and cap."""
        flow.remaining, flow.budget = levels.remaining(flow.id, now), \
            levels.window_left(flow.id, now)
        flow.updated = now
        # still held at its round's end, so its window did not bind (a member whose window
        # runs out leaves the kept shares paused): its share set its pace
        flow.pair.round_over(flow.round_budget - flow.budget, flow.round_ack, now,
                             window_bound=False)
        self._open_round(now, flow)
        if levels.renew(flow.id, cap(flow), flow.budget, now):
            self._reschedule(levels)
        else:
            self._release(now, levels)

    def _coast(self, now: float, flow: Flow) -> bool:
        """Where this round and the next ones are plain (testbed.sim.coast.plain_round),
        run this one and leave the next ones to run when the flow is next read
        (`_settle`), with one event at the end of the first that is not plain (or of the
        LOOKAHEAD-th): each plain round's event would only have scheduled the next round.
        False, doing nothing, where this round or the next is not plain."""
        state = plain_round(flow, now, state_of(flow))
        if state is None:
            return False
        ahead, end, probe = 0, now + flow.pair.rtt, state
        while ahead < LOOKAHEAD:
            after = plain_round(flow, end, probe)
            if after is None:
                break
            ahead, end, probe = ahead + 1, end + flow.pair.rtt, after
        if not ahead:
            return False
        run_round(flow, now, state)
        flow.coasting, flow.pair.coaster = True, flow
        flow.coast_id += 1
        self.schedule(end, functools.partial(self._coast_over, flow=flow, coast_id=flow.coast_id))
        return True

    def _coast_over(self, now: float, flow: Flow, coast_id: int) -> None:
        """The first round of a coast that is not plain ends: the rounds before it run,
        then it ends as any round does."""
        if flow.id not in self.flows or not flow.coasting or flow.coast_id != coast_id:
            return
        catch_up(flow, now, inclusive=False)
        flow.coasting, flow.pair.coaster = False, None
        self._round_over(now, flow, flow.round_id)

    def _settle(self, now: float, flow: Flow, inclusive: bool = True) -> None:
        """Before a coasting flow is read or changed at `now`: its rounds that ended by
        then run (up to `now` itself where their events would have run first, as round
        ends do before the shares solved at the same instant), and its next round end
        gets the event it would have had."""
        if not flow.coasting:
            return
        catch_up(flow, now, inclusive)
        flow.coasting, flow.pair.coaster = False, None
        self.schedule(flow.round_end,
                      functools.partial(self._round_over, flow=flow, round_id=flow.round_id))

    def retime(self, now: float, pair: Pair, rtt: float) -> None:
        """The pair's round trip over its links from now on (a latency event seen by its
        next message), the wait in standing queues added (`Pair.queued_s`)."""
        pair.base_rtt = rtt
        self._set_rtt(now, pair, rtt + pair.queued_s)

    def _set_rtt(self, now: float, pair: Pair, rtt: float, queued: bool = False) -> None:
        """The pair's round trip from now on. Its flows' caps (and from `retime` their
        weights) change with it, so their components share anew at the end of this
        instant (kept shares that hold them let go of them), whether or not a flow of
        theirs starts or ends: a round trip changed while one long flow sends alone sets
        its rate from then on, not from the next change beside it. `queued` (a standing
        queue's wait): only flows whose cap binds, before or after, share anew, and kept
        shares keep theirs until their next whole solve."""
        if pair.rtt == rtt:
            return
        if pair.coaster is not None:
            self._settle(now, pair.coaster)
        flows = [self.flows[fid] for fid in self._of_pair.get(id(pair), ())]
        before = [cap(f) for f in flows] if queued else []
        pair.rtt = rtt
        if queued:
            flows = [f for f, old in zip(flows, before, strict=True)
                     if f.rate >= min(old, cap(f)) * SATURATED and not self._holds(f)]
        resources = [r for f in flows for r in f.resources]
        if resources:
            self._reallocate(now, tuple(dict.fromkeys(resources)))

    def _share(self, now: float, flow: Flow) -> None:
        """The flow's rate changed: a flow alone on its links takes at once what max_min
        would give it (its cap or its slowest link); otherwise its component shares anew."""
        users, capacity = self.users, self.capacity
        for resource in flow.resources:  # loops, not any() and min(): a hot path
            if len(users[resource]) > 1:
                self._reallocate(now, flow.resources)
                return
        rate = limit = 0.0
        if not flow.paused:
            rate = limit = cap(flow)
            for resource in flow.resources:
                link = capacity[resource] * PAYLOAD_EFFICIENCY
                if link < rate:
                    rate = link
        self._set_rate(now, flow, rate)
        if self.queues.touched(flow, rate, limit):
            self._requeue(now, [flow], {flow.id: rate}, flow.resources)

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
            self._finish(now, flow)
        else:
            flow.paused = True
            self._share(now, flow)

    def _finish(self, now: float, flow: Flow) -> None:
        """The flow's last byte left."""
        if flow.steady:
            flow.pair.acked(flow.steady_bytes, now)
        else:
            flow.pair.send_off(flow.round_budget - flow.budget, flow.round_ack, now)
        del self.flows[flow.id]
        for resource in flow.resources:
            self.users[resource].discard(flow.id)
        if flow.pair.queued_links:
            drained = self.queues.leave(flow, self.users)
            if drained:
                self._requeue(now, [], {}, drained)
        siblings = self._of_pair[id(flow.pair)]
        siblings.discard(flow.id)
        if not siblings:
            del self._of_pair[id(flow.pair)]
        levels = self._kept.get(flow.resources[0])
        if levels is not None and not levels.holds(flow.id):
            levels = None
        tail = flow.pair.tail_wait(last_round_bytes(
            flow, levels.rate(flow.id) if levels is not None else flow.rate)) \
            if flow.pair.loss else 0.0  # before `end`, which lets the message's pieces go
        flow.pair.end(now)
        if levels is not None:
            if levels.leave(flow.id, now):
                self._reschedule(levels)
            else:
                self._release(now, levels)
        else:
            shared = tuple(r for r in flow.resources if self.users[r])
            if shared:  # the flows left on its links share anew
                self._reallocate(now, shared)
        if siblings:
            self._pair_changed(now, flow)
        self.schedule(now + flow.latency + tail, flow.on_arrival)
        if flow.on_sent is not None:
            flow.on_sent(now)

    def _pair_changed(self, now: float, flow: Flow) -> None:
        """`flow` started or ended while others of its pair were under way: what each of
        them may take of the pair's window and weight changed, so every one whose links
        are not the flow's own (those share anew already) shares anew in its component."""
        for fid in self._of_pair.get(id(flow.pair), ()):
            other = self.flows[fid]
            if other is flow or other.resources == flow.resources:
                continue
            levels = self._kept.get(other.resources[0])
            if levels is not None and levels.holds(fid):
                self._release(now, levels)
            else:
                self._reallocate(now, other.resources)

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
        on when in it the shares are solved), each coupled component once; kept shares
        they meet are released to be solved with them."""
        for resource in resources:
            levels = self._kept.get(resource)
            if levels is not None:
                self._release(now, levels)
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
            self._settle(now, flow)
            flow.progress(now)
        sending = [f for f in flows if not f.paused]
        shares = {f.id: (f.weight(), cap(f), f.resources) for f in sending}
        capacity = {r: self.capacity[r] * PAYLOAD_EFFICIENCY for r in seen}
        rates = max_min(shares, capacity)
        if self.queues.queue_bytes:
            self._requeue(now, flows, rates, seen)
        if len(flows) >= self.incremental_from \
                and self._keep(now, flows, seen, shares, capacity, rates):
            return seen
        for flow in flows:
            self._set_rate(now, flow, rates.get(flow.id, 0.0))
        return seen

    def _keep(self, now: float, flows: list[Flow], seen: set[str],
              shares: dict[int, tuple[float, float, tuple[str, ...]]],
              capacity: dict[str, float], rates: dict[int, float]) -> bool:
        """Keep the component's shares from now on where they have the simple form
        (testbed.sim.levels): every flow the only flow of its pair (whose weight another
        flow's start or end would change), on a path without random loss; the paused
        ones join as their next round opens. Not where most of its flows' next events
        fall at one instant (replicas in lockstep, as equal shares hold them): a whole
        solve serves all of them at once, where kept shares take an event each."""
        for flow in flows:
            pair = flow.pair
            if pair.active != 1 or pair.settled or pair.lossy:
                return False
        nexts = {now + min(f.remaining, f.budget) * 8 / rates[f.id]
                 for f in flows if rates.get(f.id)}
        if len(nexts) * 2 <= len(shares):
            return False
        levels = Levels.build(
            [(f.id, *shares[f.id][:2], f.resources, f.remaining, f.budget)
             for f in flows if not f.paused], capacity, rates, now)
        if levels is None:
            return False
        levels.covered.update(seen)
        self._kept.update(dict.fromkeys(levels.resources(), levels))
        for flow in flows:  # their own events are void: their links' are theirs now
            flow.version += 1
            flow.scheduled = False
            if flow.paused:
                flow.rate = 0.0
        self._reschedule(levels)
        return True

    def _join(self, now: float, flow: Flow) -> bool:
        """A flow starts: where it meets the kept shares, it joins them if they keep their
        form with it; if they do not, they are solved whole. False where it was not kept."""
        for resource in flow.resources:  # kept but no longer shared: it meets none
            kept = self._kept.get(resource)
            if kept is not None and len(self.users[resource]) == 1 and kept.uncover(resource):
                del self._kept[resource]
        met = {id(k): k for r in flow.resources if (k := self._kept.get(r)) is not None}
        if not met:
            return False  # another component
        pair = flow.pair
        levels = next(iter(met.values()))
        alone = all(r in self._kept or len(self.users[r]) == 1 for r in flow.resources)
        if len(met) == 1 and alone and not flow.paused \
                and pair.active == 1 and not pair.settled and not pair.lossy:
            capacity = {r: self.capacity[r] * PAYLOAD_EFFICIENCY for r in flow.resources}
            if levels.join(flow.id, flow.weight(), cap(flow), flow.resources,
                           flow.remaining, flow.budget, now, capacity):
                self._kept.update(dict.fromkeys(flow.resources, levels))
                self._reschedule(levels)
                return True
        for kept in met.values():
            self._release(now, kept)
        return False

    def _release(self, now: float, levels: Levels) -> None:
        """The kept shares lose their form: their flows take their bytes and rates back
        and their component is solved whole at the end of this instant."""
        for resource in levels.resources():
            if self._kept.get(resource) is levels:  # (a flow that failed to join
                del self._kept[resource]  # added its resources to the shares alone)
        for fid, (left, rate, window) in levels.release(now).items():
            flow = self.flows[fid]
            flow.remaining, flow.rate, flow.budget, flow.updated = left, rate, window, now
            flow.scheduled = False
        self._reallocate(now, tuple(r for r in levels.resources() if self.users[r]))

    def _reschedule(self, levels: Levels) -> None:
        """An event for each kept link (or dependent) whose next end may have moved."""
        for name in levels.take_changed():
            self._next_end(levels, name)

    def _next_end(self, levels: Levels, link: str) -> None:
        end = levels.next_end(link)
        if end is not None:
            self.schedule(end[0], functools.partial(self._link_end, levels=levels, link=link,
                                                    version=levels.version(link)))

    def _link_end(self, now: float, levels: Levels, link: str, version: int) -> None:
        """The first of a kept link's flows to run out of bytes ends, or out of its
        round's window pauses (as `_event` tells them), unless the link changed since."""
        if self._kept.get(link) is not levels or levels.version(link) != version:
            return
        end = levels.next_end(link)
        assert end is not None
        flow = self.flows[end[1]]
        flow.remaining, flow.budget = levels.remaining(flow.id, now), \
            levels.window_left(flow.id, now)
        flow.updated = now
        if flow.remaining <= 1e-3 or flow.budget > 1e-3:
            self._finish(now, flow)
            return
        flow.paused, flow.rate = True, 0.0
        if levels.leave(flow.id, now):
            self._reschedule(levels)
        else:
            self._release(now, levels)

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
        left = flow.remaining if flow.remaining <= flow.budget else flow.budget
        done = now + left * 8 / flow.rate
        if done > flow.round_end:
            return
        self.schedule(done, functools.partial(self._event, flow_id=flow.id, version=flow.version))

    def _requeue(self, now: float, flows: list[Flow], rates: dict[int, float],
                 resources: Iterable[str]) -> None:
        """Standing queues where `flows` send at `rates` (StandingQueues.update); the losses
        of those that overflow (StandingQueues.losses), each pair keeping the threshold
        its loss sets (Pair.cut): a steady flow's window then binds again (rounds)."""
        for pair, rtt in self.queues.update(now, flows, rates, self.capacity, resources,
                                            self.flows):
            self._set_rtt(now, pair, rtt, queued=True)
        for flow, in_flight in self.queues.losses(flows, rates, self.capacity):
            if not flow.pair.cuts(now):
                continue
            if flow.steady:  # what it sent so far, acknowledged first
                flow.progress(now)
                flow.pair.acked(flow.steady_bytes - flow.remaining, now)
                flow.steady_bytes = flow.remaining
            if flow.pair.cut(now, in_flight) and flow.steady:
                flow.steady = False
                self._open_round(now, flow)
                self._reallocate(now, flow.resources)

    def _holds(self, flow: Flow) -> bool:
        """Whether kept shares hold the flow."""
        levels = self._kept.get(flow.resources[0])
        return levels is not None and levels.holds(flow.id)
