"""The kept shares' form (testbed.sim.levels) as one whole solve of a component shows
it: the resources its flows fill, each flow's link, and the flows that depend on a
resource they share with others' links. Pure."""

from __future__ import annotations

MARGIN = 1e-9
"""Relative slack every condition of the form keeps: ties and float residue fall back to
the whole solve, or leave a flow capped or not where either gives its rate to this
precision."""

Flow = tuple[int, float, float, tuple[str, ...], float, float]
"""(id, weight, cap in bit/s, resources, bytes left, bytes its round's window has left)."""


def full_resources(flows: list[Flow], capacity: dict[str, float], rates: dict[int, float]
                   ) -> set[str]:
    """The resources these flows fill at `rates`."""
    load: dict[str, float] = {}
    for fid, _, _, resources, _, _ in flows:
        for resource in resources:
            load[resource] = load.get(resource, 0.0) + rates[fid]
    return {r for r, used in load.items()
            if capacity[r] > 0 and used >= capacity[r] * (1 - MARGIN)}


def placements(flows: list[Flow], full: set[str], rates: dict[int, float]
               ) -> dict[int, str] | None:
    """Each flow's link: the one full resource it crosses, or for a flow held to its cap
    that crosses none, the one other flows' link it crosses; None where a flow has
    none or two."""
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
    return placed


def dependents(flows: list[Flow], full: set[str]) -> dict[int, str]:
    """The flows a build takes as dependents, by id -> their shared resource: where one
    flow crossing a full resource crosses no other full one and every other flow there
    crosses another full one (its link), the resource fills only with that flow."""
    crossing: dict[str, list[Flow]] = {}
    for flow in flows:
        for resource in flow[3]:
            if resource in full:
                crossing.setdefault(resource, []).append(flow)
    found: dict[int, str] = {}
    for resource, there in crossing.items():
        alone = [f for f in there if not any(r in full and r != resource for r in f[3])]
        if len(alone) == 1 and len(there) > 1:
            found[alone[0][0]] = resource
    return found
