"""Weighted max-min shares kept from event to event where they take a simple form: the flow
model's fast path (testbed.sim.network), for many concurrent flows. Pure.

The form: every flow crosses exactly one link of the form, where it is either bottlenecked
or held to its cap; every other resource a flow crosses would still have room were all
its flows at the highest level of any link. Progressive filling (testbed.sim.max_min)
then gives each flow on a link its cap where the cap is below its weight x the link's
level, and the others that level: what the capped flows leave of the link's capacity / the
others' total weight. The same rule, computed per link as flows start, end and change
their caps (log n each) instead of over the whole component. A link serves its uncapped
flows by a virtual clock (bits per unit of weight), so a change of its level touches no
flow: a flow ends when the clock reaches the value it was given on joining, and its
bytes are read from the clock only when asked; a capped flow's bytes go at its cap, by
the real clock. A flow in slow start has a round's window too: where that runs out is
when it pauses (it leaves, to join again as its next round opens, `renew` where it did
not run out). One more kind of flow is kept: a dependent, on no link, whose one resource
that members cross it shares with them (a NIC where a transfer within a DC meets a WAN
flow). Max-min fills that resource after each member there is held where it would be
without it (its link's level, its cap); the dependent takes what is left, and a member
the resource holds first takes that as a bound on its link, like a cap
(`_share_dependent`, after every change). Where a change would leave the form, the
caller solves the component whole (`Levels.release`)."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from testbed.sim.kept_form import MARGIN, Flow, dependents, full_resources, placements

INF = float("inf")
BOUND_ROUNDS = 8
"""Rounds of sharing dependents' resources a change may take before its shares settle
(one or two where a resource has one member): past it, the component is solved whole."""


@dataclass
class _Link:
    capacity: float
    weight: float = 0.0
    """Of its uncapped flows."""
    fixed: float = 0.0
    """bit/s its capped flows take."""
    summed: int = 0
    """How many flows the sums were last taken over afresh (a running sum drifts)."""
    level: float = 0.0
    """bit/s per unit of weight of its uncapped flows."""
    clock: float = 0.0
    since: float = 0.0
    version: int = 0
    flows: dict[int, float] = field(default_factory=dict)
    """Uncapped flow id -> weight."""
    capped: dict[int, float] = field(default_factory=dict)
    """Capped flow id -> cap."""
    ends: list[tuple[float, int, int]] = field(default_factory=list)
    """Uncapped flows: (clock value at which its bytes or its round's window run out,
    flow id, token), stale ones left in until they surface."""
    timed: list[tuple[float, int, int]] = field(default_factory=list)
    """Capped flows: (time at which its bytes or its round's window run out, id, token)."""
    caps: list[tuple[float, int, int]] = field(default_factory=list)
    """Uncapped flows: (cap / weight, id, token): the first to cap as the level rises."""
    uncaps: list[tuple[float, int, int]] = field(default_factory=list)
    """Capped flows: (-cap / weight, id, token): the first to uncap as the level falls."""

    def clock_at(self, now: float) -> float:
        return self.clock + self.level * (now - self.since)

    def advance(self, now: float) -> None:
        self.clock, self.since = self.clock_at(now), now

    def relevel(self, version: int) -> None:
        count = len(self.flows) + len(self.capped)
        if count * 2 < self.summed or count > 2 * self.summed:
            self.weight = sum(self.flows.values())
            self.fixed = sum(self.capped.values())
            self.summed = count
        level = (self.capacity - self.fixed) / self.weight if self.flows else 0.0
        self.level = level if level > 0.0 else 0.0
        self.version = version


@dataclass
class _Member:
    link: str
    weight: float
    own_cap: float
    others: tuple[str, ...]
    token: int = 0
    """Tells its entries in its link's heaps from those of its earlier states."""
    capped: bool = False
    end: float = 0.0
    """Uncapped: the link's clock value at which its bytes run out..."""
    window_end: float = 0.0
    """... and at which its round's window does (inf once steady)."""
    since: float = 0.0
    """Capped: when its bytes were last read..."""
    left: float = 0.0
    """... what it had left of them then..."""
    window: float = 0.0
    """... and of its round's window (inf once steady)."""
    bound: float = INF
    """What a dependent's resource it crosses leaves it, where that fills first."""

    @property
    def cap(self) -> float:
        return self.own_cap if self.own_cap < self.bound else self.bound


@dataclass
class _Dependent:
    """A flow on no link of the form whose one shared resource members also cross: it
    takes what they leave of it (up to its cap and its other resources, which it has
    alone), so its rate follows their links' levels."""

    resource: str
    weight: float
    limit: float
    """Its cap, or its other resources' capacity where less."""
    others: tuple[str, ...]
    since: float
    left: float
    window: float
    rate: float = 0.0
    version: int = 0


class Levels:
    """The shares of a set of flows in the simple form, and the resources they cross."""

    def __init__(self) -> None:
        self.links: dict[str, _Link] = {}
        self.members: dict[int, _Member] = {}
        self._room: dict[str, float] = {}
        """bit/s of every other resource."""
        self._load: dict[str, float] = {}
        """Total weight of the uncapped flows on each other resource."""
        self._fixed: dict[str, float] = {}
        """bit/s the capped flows on each other resource take."""
        self._count: dict[str, int] = {}
        self._ratios: list[tuple[float, str, int]] = []
        """(-load / (room - fixed), resource, version): the fullest at its top."""
        self._ratio_version: dict[str, int] = {}
        self._levels: list[tuple[float, str, int]] = []
        """(-level, link, version): the highest level at its top."""
        self.covered: set[str] = set()
        """Resources of the component's paused flows no member crosses: a flow that
        starts on one meets the kept shares."""
        self._tokens = itertools.count()
        self._versions = itertools.count(1)
        """Of links and dependents alike: no end pending for one matches another."""
        self.dependents: dict[int, _Dependent] = {}
        self._dependent_on: dict[str, int] = {}
        """Every resource a dependent crosses -> that dependent."""
        self._crossing: dict[str, dict[int, None]] = {}
        """Members crossing each other resource (a dependent there takes what they leave)."""
        self._capacity: dict[str, float] = {}
        self._broken = False
        """A member crosses a resource a dependent was to have alone."""
        self.changed: set[str] = set()
        """Links (and dependents' shared resources) whose next end may have moved since
        the caller last took them (`take_changed`)."""

    @classmethod
    def build(cls, flows: list[Flow], capacity: dict[str, float], rates: dict[int, float],
              now: float) -> Levels | None:
        """The form of these flows (a whole component, `rates` its shares as max_min
        solved them), or None where it does not hold. A flow's link is the one resource
        it crosses that its flows fill; a flow held to its cap that fills none is on the
        one other flows' link it crosses."""
        if not flows:
            return None
        full = full_resources(flows, capacity, rates)
        depending = dependents(flows, full)
        placed = placements([f for f in flows if f[0] not in depending],
                            full - set(depending.values()), rates)
        if placed is None:
            return None
        levels = cls()
        levels._capacity = dict(capacity)  # its own: joins add to it
        for fid, weight, cap, resources, left, window in flows:
            if fid in depending:
                continue
            link = placed[fid]
            kept = levels.links.setdefault(link, _Link(capacity[link], since=now))
            member = _Member(link, weight, cap, tuple(r for r in resources if r != link))
            levels.members[fid] = member
            for resource in member.others:
                levels._room.setdefault(resource, capacity[resource])
            levels._place(fid, member, kept, left, window, now, capped=False)
        for name, kept in levels.links.items():
            levels._settle(name, kept, now)
        for fid, weight, cap, resources, left, window in flows:
            if fid in depending and not levels._depend(fid, weight, cap, resources,
                                                       depending[fid], left, window, now):
                return None
        return levels if levels._holds(now) else None

    def resources(self) -> list[str]:
        return list(dict.fromkeys([*self.links, *self._room, *self._dependent_on,
                                   *sorted(self.covered)]))

    def uncover(self, resource: str) -> bool:
        """Let go of a resource none of the flows here crosses any more (whether it was
        let go): a flow starting on it alone does not meet these shares."""
        link = self.links.get(resource)
        if resource in self._dependent_on or self._count.get(resource, 0) \
                or (link is not None and (link.flows or link.capped)):
            return False
        self.covered.discard(resource)
        self.links.pop(resource, None)
        if self._room.pop(resource, None) is not None:
            self._ratio_version[resource] += 1
        return True

    def holds(self, fid: int) -> bool:
        """Whether the flow's shares are kept here."""
        return fid in self.members or fid in self.dependents

    def take_changed(self) -> list[str]:
        changed, self.changed = sorted(self.changed), set()
        return changed

    def join(self, fid: int, weight: float, cap: float, resources: tuple[str, ...],
             nbytes: float, window: float, now: float, capacity: dict[str, float]) -> bool:
        """Add a flow that crosses one of the links; whether the form holds with it (if
        not, the caller releases the shares, the flow with them where it was added)."""
        self._capacity.update(capacity)
        links = [r for r in resources if r in self.links]
        if not links:
            shared = [r for r in resources if self._crossing.get(r)]
            if len(shared) > 1:
                return False
            return self._depend(fid, weight, cap, resources, (shared or resources)[0],
                                nbytes, window, now) and self._holds(now)
        if len(links) != 1:
            return False
        name = links[0]
        link = self.links[name]
        member = _Member(name, weight, cap, tuple(r for r in resources if r != name))
        self.members[fid] = member
        for resource in member.others:
            self._room.setdefault(resource, capacity[resource])
        link.advance(now)
        self._place(fid, member, link, nbytes, window, now, capped=False)
        self._settle(name, link, now)
        return self._holds(now)

    def renew(self, fid: int, cap: float, window: float, now: float) -> bool:
        """The flow's next round opens with `window` bytes to send (inf once steady) and
        `cap`; whether the form still holds."""
        dependent = self.dependents.get(fid)
        if dependent is not None:
            left, _ = self._read_dependent(dependent, now)
            dependent.since, dependent.left, dependent.window = now, left, window
            dependent.limit = min([cap, *(self._capacity[r] for r in dependent.others)])
            dependent.rate = -1.0  # (taken anew by _holds)
            return self._holds(now)
        member = self.members[fid]
        if self._window_only(member, cap):
            self._new_window(fid, member, cap, window, now)
            return True
        self._reseat(fid, member, now, window=window, own_cap=cap)
        return self._holds(now)

    def _window_only(self, member: _Member, cap: float) -> bool:
        """Whether a new round leaves the member where it is: uncapped before and after
        (its cap stays above its link's level, as `_settle` caps), with no dependent's
        resource in its path (whose fill reads its cap). Then no other flow's share moves
        and the form holds as it did: only its window's end does."""
        if member.capped or member.bound < INF or self._broken:
            return False
        if any(r in self._dependent_on for r in member.others):
            return False
        return cap / member.weight >= self.links[member.link].level * (1 - MARGIN)

    def _new_window(self, fid: int, member: _Member, cap: float, window: float,
                    now: float) -> None:
        """`renew` where only the member's window's end and cap move (`_window_only`): its
        heap entries anew, and its link's next end read again."""
        link = self.links[member.link]
        member.own_cap = cap
        member.window_end = link.clock_at(now) + window * 8 / member.weight
        token = member.token = next(self._tokens)
        heapq.heappush(link.ends, (min(member.end, member.window_end), fid, token))
        heapq.heappush(link.caps, (member.cap / member.weight, fid, token))
        link.version = next(self._versions)
        self._publish(member.link, link)

    def leave(self, fid: int, now: float) -> bool:
        """Remove a flow; whether the form still holds for the rest."""
        dependent = self.dependents.pop(fid, None)
        if dependent is not None:
            for resource in (dependent.resource, *dependent.others):
                del self._dependent_on[resource]
            for other in list(self._crossing.get(dependent.resource, ())):
                self._bind(other, INF, now)  # its resource no longer fills first
            return self._holds(now)
        member = self.members[fid]
        link = self.links[member.link]
        link.advance(now)
        self._unplace(fid, member, link, now)
        del self.members[fid]
        self._settle(member.link, link, now)
        return self._holds(now)

    def version(self, name: str) -> int:
        """Of a link, or of the dependent on a resource (-1 for none)."""
        link = self.links.get(name)
        if link is not None:
            return link.version
        fid = self._dependent_on.get(name)
        return -1 if fid is None else self.dependents[fid].version

    def next_end(self, name: str) -> tuple[float, int] | None:
        """When the link's next flow runs out of bytes or of its round's window, and
        which (or the dependent's on a resource)."""
        link = self.links.get(name)
        if link is None:
            fid = self._dependent_on.get(name)
            if fid is None:
                return None
            dependent = self.dependents[fid]
            if dependent.rate <= 0.0:
                return None
            due = min(dependent.left, dependent.window)
            return dependent.since + due * 8 / dependent.rate, fid
        ends, timed = link.ends, link.timed
        while ends and not self._current(ends[0][1], ends[0][2]):
            heapq.heappop(ends)
        while timed and not self._current(timed[0][1], timed[0][2]):
            heapq.heappop(timed)
        first: tuple[float, int] | None = None
        if ends and link.level > 0.0:
            end, fid, _ = ends[0]
            first = link.since + max(0.0, end - link.clock) / link.level, fid
        if timed and (first is None or timed[0][0] < first[0]):
            first = timed[0][0], timed[0][1]
        return first

    def remaining(self, fid: int, now: float) -> float:
        """Bytes the flow has left at `now`."""
        return self._read_any(fid, now)[0]

    def window_left(self, fid: int, now: float) -> float:
        """Bytes the flow's round's window has left at `now` (inf once steady)."""
        return self._read_any(fid, now)[1]

    def rate(self, fid: int) -> float:
        dependent = self.dependents.get(fid)
        if dependent is not None:
            return dependent.rate
        member = self.members[fid]
        return member.cap if member.capped else member.weight * self.links[member.link].level

    def release(self, now: float) -> dict[int, tuple[float, float, float]]:
        """Every flow's bytes left, rate and window left at `now`: the caller takes them
        over."""
        shares = {}
        for fid in [*self.members, *self.dependents]:
            left, window = self._read_any(fid, now)
            shares[fid] = left, self.rate(fid), window
        return shares

    def _read_any(self, fid: int, now: float) -> tuple[float, float]:
        dependent = self.dependents.get(fid)
        if dependent is not None:
            return self._read_dependent(dependent, now)
        return self._read(self.members[fid], now)

    @staticmethod
    def _read_dependent(dependent: _Dependent, now: float) -> tuple[float, float]:
        sent = dependent.rate * (now - dependent.since) / 8 if dependent.rate > 0 else 0.0
        left, window = dependent.left - sent, dependent.window - sent
        return (left if left > 0.0 else 0.0), (window if window > 0.0 else 0.0)

    def _depend(self, fid: int, weight: float, cap: float, resources: tuple[str, ...],
                resource: str, left: float, window: float, now: float) -> bool:
        """Add a dependent on `resource`, if it has its other resources to itself."""
        others = tuple(r for r in resources if r != resource)
        if any(r in self._dependent_on for r in resources) \
                or any(self._crossing.get(r) or r in self.links for r in others):
            return False
        limit = min([cap, *(self._capacity[r] for r in others)])
        self.dependents[fid] = _Dependent(resource, weight, limit, others, now, left, window,
                                          rate=-1.0, version=next(self._versions))
        for r in resources:
            self._dependent_on[r] = fid
        self.covered.update(resources)
        return True

    def _holds(self, now: float) -> bool:
        """Whether the form holds (rooms left, nothing broken), after each dependent's
        resource is shared as max-min shares it (`_share_dependent`) until none moves."""
        if self._broken or not self._rooms_hold():
            return False
        for _ in range(BOUND_ROUNDS):
            if not any([self._share_dependent(d, now) for d in self.dependents.values()]):
                return self._rooms_hold()
        return False

    def _share_dependent(self, dependent: _Dependent, now: float) -> bool:
        """Fill the dependent's resource: each flow there (its members and the dependent)
        is held where it would be held without it (its link's level, its cap) if that is
        below the level the resource fills at; the others take that level, the members
        as a bound on their links. Whether a member's bound moved."""
        resource = dependent.resource
        held: list[tuple[float, int]] = [(dependent.limit / dependent.weight, -1)]
        for fid in self._crossing.get(resource, ()):
            held.append((self._free_level(self.members[fid]), fid))
        held.sort()
        room, weight = self._capacity[resource], dependent.weight + sum(
            self.members[fid].weight for _, fid in held if fid >= 0)
        level = INF
        for free, fid in held:
            level = room / weight
            if free >= level * (1 - MARGIN):
                break
            share = self.members[fid].weight if fid >= 0 else dependent.weight
            room, weight, level = room - free * share, weight - share, INF
        moved = False
        for free, fid in held:
            bound = INF if free < level * (1 - MARGIN) else level
            if fid < 0:
                self._set_dependent_rate(dependent, dependent.weight * bound
                                         if bound < INF else dependent.limit, now)
                continue
            member = self.members[fid]
            moved |= self._bind(fid, bound * member.weight if bound < INF else INF, now)
        return moved

    def _bind(self, fid: int, bound: float, now: float) -> bool:
        """Bound a member to what a dependent's resource leaves it (INF: none); whether
        that moved its bound."""
        member = self.members[fid]
        if bound == member.bound or (
                bound < INF and abs(bound - member.bound) <= MARGIN * 1e-3 * bound):
            return False
        self._reseat(fid, member, now, bound=bound)
        return True

    def _reseat(self, fid: int, member: _Member, now: float, window: float | None = None,
                own_cap: float | None = None, bound: float | None = None) -> None:
        """Take the member off its link and put it back with a new round's window, cap or
        bound, where its link's sharing then puts it."""
        link = self.links[member.link]
        link.advance(now)
        left, window_left = self._unplace(fid, member, link, now)
        if own_cap is not None:
            member.own_cap = own_cap
        if bound is not None:
            member.bound = bound
        self._place(fid, member, link, left, window_left if window is None else window, now,
                    member.capped)
        self._settle(member.link, link, now)

    def _free_level(self, member: _Member) -> float:
        """The level a member would be held at without its bound: its own cap's, or its
        link's with it uncapped."""
        own = member.own_cap / member.weight
        if not member.capped:
            return min(own, self.links[member.link].level)
        link = self.links[member.link]
        level = (link.capacity - link.fixed + member.cap) / (link.weight + member.weight)
        return min(own, level)

    def _set_dependent_rate(self, dependent: _Dependent, rate: float, now: float) -> None:
        if rate != dependent.rate:
            if dependent.rate > 0.0:
                dependent.left, dependent.window = self._read_dependent(dependent, now)
            dependent.since, dependent.rate = now, rate
            dependent.version = next(self._versions)
            self.changed.add(dependent.resource)

    def _current(self, fid: int, token: int) -> bool:
        member = self.members.get(fid)
        return member is not None and member.token == token

    def _read(self, member: _Member, now: float) -> tuple[float, float]:
        """Its bytes left and its round's window left at `now`."""
        if member.capped:
            sent = member.cap * (now - member.since) / 8
            left, window = member.left - sent, member.window - sent
        else:
            clock = self.links[member.link].clock_at(now)
            left = (member.end - clock) * member.weight / 8
            window = (member.window_end - clock) * member.weight / 8
        return (left if left > 0.0 else 0.0), (window if window > 0.0 else 0.0)

    def _place(self, fid: int, member: _Member, link: _Link, left: float, window: float,
               now: float, capped: bool) -> None:
        """Put the member on its link (advanced to `now`), capped or not, with these bytes
        and window left."""
        token = member.token = next(self._tokens)
        capped = member.capped = capped and member.cap < INF
        if capped:
            link.capped[fid] = member.cap
            link.fixed += member.cap
            member.since, member.left, member.window = now, left, window
            done = now + (left if left <= window else window) * 8 / member.cap
            heapq.heappush(link.timed, (done, fid, token))
            heapq.heappush(link.uncaps, (-member.cap / member.weight, fid, token))
        else:
            link.flows[fid] = member.weight
            link.weight += member.weight
            member.end = link.clock + left * 8 / member.weight
            member.window_end = link.clock + window * 8 / member.weight
            heapq.heappush(link.ends, (min(member.end, member.window_end), fid, token))
            heapq.heappush(link.caps, (member.cap / member.weight, fid, token))
        for resource in member.others:
            self._count[resource] = self._count.get(resource, 0) + 1
            self._crossing.setdefault(resource, {})[fid] = None
            if resource in self._dependent_on \
                    and self.dependents[self._dependent_on[resource]].resource != resource:
                self._broken = True
            if capped:
                self._fixed[resource] = self._fixed.get(resource, 0.0) + member.cap
            else:
                self._load[resource] = self._load.get(resource, 0.0) + member.weight
            self._push_ratio(resource)

    def _unplace(self, fid: int, member: _Member, link: _Link, now: float
                 ) -> tuple[float, float]:
        """Take the member off its link (advanced to `now`); its bytes and window left."""
        read = self._read(member, now)
        member.token = -1
        if member.capped:
            del link.capped[fid]
            link.fixed -= member.cap
        else:
            del link.flows[fid]
            link.weight -= member.weight
        for resource in member.others:
            count = self._count[resource] = self._count[resource] - 1
            del self._crossing[resource][fid]
            if member.capped:
                self._fixed[resource] = self._fixed[resource] - member.cap if count else 0.0
            else:
                self._load[resource] = self._load[resource] - member.weight if count else 0.0
            if not count:
                self._load[resource] = self._fixed[resource] = 0.0
            self._push_ratio(resource)
        return read

    def _settle(self, name: str, link: _Link, now: float) -> None:
        """Cap and uncap the link's flows until each is where max-min puts it: capped
        where its cap is below its weight x the level it would have uncapped."""
        while True:
            link.relevel(next(self._versions))
            uncaps = link.uncaps
            while uncaps and not self._current(uncaps[0][1], uncaps[0][2]):
                heapq.heappop(uncaps)
            if uncaps:
                fid = uncaps[0][1]
                member = self.members[fid]
                level = (link.capacity - link.fixed + member.cap) / (link.weight + member.weight)
                if -uncaps[0][0] > level * (1 + MARGIN):
                    self._move(fid, member, link, now, capped=False)
                    continue
            caps = link.caps
            while caps and not self._current(caps[0][1], caps[0][2]):
                heapq.heappop(caps)
            if caps and caps[0][0] < link.level * (1 - MARGIN):
                fid = caps[0][1]
                self._move(fid, self.members[fid], link, now, capped=True)
                continue
            break
        self._publish(name, link)

    def _publish(self, name: str, link: _Link) -> None:
        """The link's level and next end as its new version has them: for the form's check
        (_top_level) and for the caller (take_changed)."""
        heapq.heappush(self._levels, (-link.level, name, link.version))
        self.changed.add(name)

    def _move(self, fid: int, member: _Member, link: _Link, now: float, capped: bool) -> None:
        left, window = self._unplace(fid, member, link, now)
        self._place(fid, member, link, left, window, now, capped)

    def _push_ratio(self, resource: str) -> None:
        version = self._ratio_version.get(resource, 0) + 1
        self._ratio_version[resource] = version
        room = self._room[resource] - self._fixed.get(resource, 0.0)
        load = self._load.get(resource, 0.0)
        ratio = load / room if room > 0 else (INF if load > 0 or room < 0 else 0.0)
        heapq.heappush(self._ratios, (-ratio, resource, version))

    def _top_level(self) -> float:
        heap = self._levels
        while heap and (heap[0][1] not in self.links
                        or heap[0][2] != self.links[heap[0][1]].version):
            heapq.heappop(heap)
        return -heap[0][0] if heap else 0.0

    def _rooms_hold(self) -> bool:
        heap = self._ratios
        while heap and heap[0][2] != self._ratio_version[heap[0][1]]:
            heapq.heappop(heap)
        return not heap or -heap[0][0] * self._top_level() <= 1 - MARGIN

