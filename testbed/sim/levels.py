"""Weighted max-min shares kept from event to event where they take a simple form: the flow
model's fast path (testbed.sim.network), for many concurrent flows. Pure.

The form: every flow crosses exactly one saturated link, whose flows are all bottlenecked
there; every other resource a flow crosses would still have room were all its flows at the
highest level of any link; no flow's cap binds. Progressive filling (testbed.sim.max_min)
then gives each flow its weight x its link's capacity / the link's total weight: the same
rule, computed per link as flows start and end (log n each) instead of over the whole
component. A link serves its flows by a virtual clock (bits per unit of weight), so a
change of its level touches no flow: a flow ends when the clock reaches the value it was
given on joining, and its bytes are read from the clock only when asked. Where a change
would leave the form, the caller solves the component whole (`Levels.release`)."""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

MARGIN = 1e-9
"""Relative slack every condition of the form keeps: ties and float residue fall back to
the whole solve."""


@dataclass
class _Link:
    capacity: float
    weight: float = 0.0
    summed: int = 0
    """How many flows `weight` was last summed over afresh (a running sum drifts)."""
    level: float = 0.0
    """bit/s per unit of weight."""
    clock: float = 0.0
    since: float = 0.0
    version: int = 0
    flows: dict[int, float] = field(default_factory=dict)
    """Flow id -> weight."""
    ends: list[tuple[float, int]] = field(default_factory=list)
    """(clock value at which it ends, flow id), stale ones left in until they surface."""
    caps: list[tuple[float, int]] = field(default_factory=list)
    """(cap / weight, flow id): the level where the first cap would bind."""

    def clock_at(self, now: float) -> float:
        return self.clock + self.level * (now - self.since)

    def advance(self, now: float) -> None:
        self.clock, self.since = self.clock_at(now), now

    def relevel(self) -> None:
        count = len(self.flows)
        if count * 2 < self.summed or count > 2 * self.summed:
            self.weight, self.summed = sum(self.flows.values()), count
        self.level = self.capacity / self.weight if count else 0.0
        self.version += 1


@dataclass(frozen=True)
class _Member:
    link: str
    weight: float
    end: float
    others: tuple[str, ...]


Flow = tuple[int, float, float, tuple[str, ...], float]
"""(id, weight, cap in bit/s, resources, bytes left)."""


class Levels:
    """The shares of a set of flows in the simple form, and the resources they cross."""

    def __init__(self) -> None:
        self.links: dict[str, _Link] = {}
        self.members: dict[int, _Member] = {}
        self._room: dict[str, float] = {}
        """bit/s of every other resource."""
        self._load: dict[str, float] = {}
        """Total weight of the flows on each other resource."""
        self._count: dict[str, int] = {}
        self._ratios: list[tuple[float, str, int]] = []
        """(-load / room, resource, version): the fullest other resource at its top."""
        self._ratio_version: dict[str, int] = {}
        self._levels: list[tuple[float, str, int]] = []
        """(-level, link, version): the highest level at its top."""
        self.stale = False
        """A flow's weight or cap changed with nothing solved yet: whatever happens next
        is solved whole (as it takes effect there)."""

    @classmethod
    def build(cls, flows: list[Flow], capacity: dict[str, float], rates: dict[int, float],
              now: float) -> Levels | None:
        """The form of these flows (a whole component, `rates` its shares as max_min
        solved them), or None where it does not hold."""
        load: dict[str, float] = {}
        for fid, _, _, resources, _ in flows:
            for resource in resources:
                load[resource] = load.get(resource, 0.0) + rates[fid]
        full = {r for r, used in load.items()
                if capacity[r] > 0 and used >= capacity[r] * (1 - MARGIN)}
        levels = cls()
        placed = []
        for flow in flows:
            links = [r for r in flow[3] if r in full]
            if len(links) != 1:
                return None
            placed.append((flow, links[0]))
            levels.links.setdefault(links[0], _Link(capacity[links[0]], since=now))
        for (fid, weight, cap, resources, left), link in placed:
            levels._add(fid, link, weight, cap, resources, left, now, capacity)
        for name, kept in levels.links.items():
            levels._relevel(name, kept)
            if not levels._caps_hold(kept):
                return None
        return levels if levels._rooms_hold() else None

    def covers(self, resource: str) -> bool:
        return resource in self.links or resource in self._room

    def resources(self) -> list[str]:
        return [*self.links, *self._room]

    def join(self, fid: int, weight: float, cap: float, resources: tuple[str, ...],
             nbytes: float, now: float, capacity: dict[str, float]) -> bool:
        """Add a flow if the form still holds with it (nothing changes otherwise): it
        crosses one link already in use, lowering that link's level, and has room
        everywhere else at the highest level."""
        links = [r for r in resources if r in self.links]
        if len(links) != 1 or not self.links[links[0]].flows:
            return False
        name = links[0]
        link = self.links[name]
        level = link.capacity / (link.weight + weight)
        if cap / weight <= level * (1 + MARGIN):
            return False
        top = self._top_level()
        for resource in resources:
            if resource != name:
                room = self._room.get(resource, capacity[resource])
                if (self._load.get(resource, 0.0) + weight) * top > room * (1 - MARGIN):
                    return False
        link.advance(now)
        self._add(fid, name, weight, cap, resources, nbytes, now, capacity)
        self._relevel(name, link)
        return True

    def leave(self, fid: int, now: float) -> bool:
        """Remove a flow; whether the form still holds for the rest."""
        member = self.members.pop(fid)
        link = self.links[member.link]
        link.advance(now)
        del link.flows[fid]
        link.weight -= member.weight
        for resource in member.others:
            self._count[resource] -= 1
            self._load[resource] = (self._load[resource] - member.weight
                                    if self._count[resource] else 0.0)
            self._push_ratio(resource)
        self._relevel(member.link, link)
        return self._caps_hold(link) and self._rooms_hold()

    def version(self, link: str) -> int:
        return self.links[link].version

    def next_end(self, name: str) -> tuple[float, int] | None:
        """When the link's next flow ends, and which."""
        link = self.links[name]
        while link.ends and link.ends[0][1] not in link.flows:
            heapq.heappop(link.ends)
        if not link.ends:
            return None
        end, fid = link.ends[0]
        return link.since + max(0.0, end - link.clock) / link.level, fid

    def remaining(self, fid: int, now: float) -> float:
        """Bytes the flow has left at `now`."""
        member = self.members[fid]
        left = (member.end - self.links[member.link].clock_at(now)) * member.weight / 8
        return left if left > 0.0 else 0.0

    def rate(self, fid: int) -> float:
        member = self.members[fid]
        return member.weight * self.links[member.link].level

    def release(self, now: float) -> dict[int, tuple[float, float]]:
        """Every flow's bytes left and rate at `now`: the caller takes them over."""
        return {fid: (self.remaining(fid, now), self.rate(fid)) for fid in self.members}

    def _add(self, fid: int, name: str, weight: float, cap: float, resources: tuple[str, ...],
             nbytes: float, now: float, capacity: dict[str, float]) -> None:
        link = self.links[name]
        link.flows[fid] = weight
        link.weight += weight
        end = link.clock_at(now) + nbytes * 8 / weight
        heapq.heappush(link.ends, (end, fid))
        heapq.heappush(link.caps, (cap / weight, fid))
        others = tuple(r for r in resources if r != name)
        for resource in others:
            self._room.setdefault(resource, capacity[resource])
            self._count[resource] = self._count.get(resource, 0) + 1
            self._load[resource] = self._load.get(resource, 0.0) + weight
            self._push_ratio(resource)
        self.members[fid] = _Member(name, weight, end, others)

    def _relevel(self, name: str, link: _Link) -> None:
        link.relevel()
        heapq.heappush(self._levels, (-link.level, name, link.version))

    def _push_ratio(self, resource: str) -> None:
        version = self._ratio_version.get(resource, 0) + 1
        self._ratio_version[resource] = version
        room, load = self._room[resource], self._load[resource]
        ratio = load / room if room > 0 else (float("inf") if load > 0 else 0.0)
        heapq.heappush(self._ratios, (-ratio, resource, version))

    def _top_level(self) -> float:
        heap = self._levels
        while heap and heap[0][2] != self.links[heap[0][1]].version:
            heapq.heappop(heap)
        return -heap[0][0] if heap else 0.0

    def _caps_hold(self, link: _Link) -> bool:
        caps = link.caps
        while caps and caps[0][1] not in link.flows:
            heapq.heappop(caps)
        return not caps or caps[0][0] > link.level * (1 + MARGIN)

    def _rooms_hold(self) -> bool:
        heap = self._ratios
        while heap and heap[0][2] != self._ratio_version[heap[0][1]]:
            heapq.heappop(heap)
        return not heap or -heap[0][0] * self._top_level() <= 1 - MARGIN
