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
not run out). Where a change would leave the form, the caller solves the component whole
(`Levels.release`)."""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

MARGIN = 1e-9
"""Relative slack every condition of the form keeps: ties and float residue fall back to
the whole solve, or leave a flow capped or not where either gives its rate to this
precision."""

INF = float("inf")


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

    def relevel(self) -> None:
        count = len(self.flows) + len(self.capped)
        if count * 2 < self.summed or count > 2 * self.summed:
            self.weight = sum(self.flows.values())
            self.fixed = sum(self.capped.values())
            self.summed = count
        level = (self.capacity - self.fixed) / self.weight if self.flows else 0.0
        self.level = level if level > 0.0 else 0.0
        self.version += 1


@dataclass
class _Member:
    link: str
    weight: float
    cap: float
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


Flow = tuple[int, float, float, tuple[str, ...], float, float]
"""(id, weight, cap in bit/s, resources, bytes left, bytes its round's window has left)."""


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
        self.stale = False
        """A flow's weight or cap changed with nothing solved yet: whatever happens next
        is solved whole (as it takes effect there)."""
        self.covered: set[str] = set()
        """Resources of the component's paused flows no member crosses: a flow that
        starts on one meets the kept shares."""
        self._tokens = itertools.count()

    @classmethod
    def build(cls, flows: list[Flow], capacity: dict[str, float], rates: dict[int, float],
              now: float) -> Levels | None:
        """The form of these flows (a whole component, `rates` its shares as max_min
        solved them), or None where it does not hold. A flow's link is the one resource
        it crosses that its flows fill; a flow held to its cap that fills none is on the
        one other flows' link it crosses."""
        if not flows:
            return None
        load: dict[str, float] = {}
        for fid, _, _, resources, _, _ in flows:
            for resource in resources:
                load[resource] = load.get(resource, 0.0) + rates[fid]
        full = {r for r, used in load.items()
                if capacity[r] > 0 and used >= capacity[r] * (1 - MARGIN)}
        placed: dict[int, str] = {}
        for fid, _, _, resources, _, _ in flows:
            links = [r for r in resources if r in full]
            if len(links) > 1:
                return None
            if links:
                placed[fid] = links[0]
        named = set(placed.values())
        for fid, _, cap, resources, _, _ in flows:
            if fid not in placed:
                links = [r for r in resources if r in named]
                if len(links) != 1 or rates[fid] < cap * (1 - MARGIN):
                    return None
                placed[fid] = links[0]
        levels = cls()
        for fid, weight, cap, resources, left, window in flows:
            link = placed[fid]
            kept = levels.links.setdefault(link, _Link(capacity[link], since=now))
            member = _Member(link, weight, cap, tuple(r for r in resources if r != link))
            levels.members[fid] = member
            for resource in member.others:
                levels._room.setdefault(resource, capacity[resource])
            levels._place(fid, member, kept, left, window, now, capped=False)
        for name, kept in levels.links.items():
            levels._settle(name, kept, now)
        return levels if levels._rooms_hold() else None

    def uncover(self, resource: str) -> bool:
        """Let go of a resource none of the flows here crosses any more (whether it was
        let go): a flow starting on it alone does not meet these shares."""
        link = self.links.get(resource)
        if self._count.get(resource, 0) or (link is not None and (link.flows or link.capped)):
            return False
        self.covered.discard(resource)
        self.links.pop(resource, None)
        if self._room.pop(resource, None) is not None:
            self._ratio_version[resource] += 1
        return True

    def resources(self) -> list[str]:
        return list(dict.fromkeys([*self.links, *self._room, *sorted(self.covered)]))

    def join(self, fid: int, weight: float, cap: float, resources: tuple[str, ...],
             nbytes: float, window: float, now: float, capacity: dict[str, float]) -> bool:
        """Add a flow that crosses one of the links; whether the form holds with it (if
        not, the caller releases the shares, the flow with them where it was added)."""
        links = [r for r in resources if r in self.links]
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
        return self._rooms_hold()

    def renew(self, fid: int, cap: float, window: float, now: float) -> bool:
        """The flow's next round opens with `window` bytes to send (inf once steady) and
        `cap`; whether the form still holds."""
        member = self.members[fid]
        link = self.links[member.link]
        link.advance(now)
        left, _ = self._unplace(fid, member, link, now)
        member.cap = cap
        self._place(fid, member, link, left, window, now, member.capped)
        self._settle(member.link, link, now)
        return self._rooms_hold()

    def leave(self, fid: int, now: float) -> bool:
        """Remove a flow; whether the form still holds for the rest."""
        member = self.members[fid]
        link = self.links[member.link]
        link.advance(now)
        self._unplace(fid, member, link, now)
        del self.members[fid]
        self._settle(member.link, link, now)
        return self._rooms_hold()

    def version(self, link: str) -> int:
        return self.links[link].version

    def next_end(self, name: str) -> tuple[float, int] | None:
        """When the link's next flow runs out of bytes or of its round's window, and
        which."""
        link = self.links[name]
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
        return self._read(self.members[fid], now)[0]

    def window_left(self, fid: int, now: float) -> float:
        """Bytes the flow's round's window has left at `now` (inf once steady)."""
        return self._read(self.members[fid], now)[1]

    def rate(self, fid: int) -> float:
        member = self.members[fid]
        return member.cap if member.capped else member.weight * self.links[member.link].level

    def release(self, now: float) -> dict[int, tuple[float, float, float]]:
        """Every flow's bytes left, rate and window left at `now`: the caller takes them
        over."""
        shares = {}
        for fid, member in self.members.items():
            left, window = self._read(member, now)
            shares[fid] = left, self.rate(fid), window
        return shares

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
        member.capped = capped
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
            link.relevel()
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
        heapq.heappush(self._levels, (-link.level, name, link.version))

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
