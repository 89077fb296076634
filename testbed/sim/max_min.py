"""Weighted max-min fair sharing of link capacity among flows, the flow model's rate rule
(testbed.sim.network). Pure."""

from __future__ import annotations

import heapq


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
    flows freeze. The rate of one flow of each group.

    Each step takes the lowest level a resource fills at from a heap of them (entries
    made stale by a later change are skipped by version) and the groups whose cap comes
    first from a heap of caps, so a solve costs (groups + resources) x log, not groups x
    steps; the steps, their order and their arithmetic are those of a scan of every
    resource and group per step, so the rates are the same to the bit (tested), but for
    a resource all of whose flows are frozen: it is no bottleneck any more (a scan by
    weight alone met it again and again where weights are large enough for the float
    residue of their sum to pass for a live flow's)."""
    rates: dict[int, float] = {}
    left = dict(capacity)
    weights: dict[str, float] = {}
    users: dict[str, list[int]] = {}
    for gid, (weight, _, resources, count) in groups.items():
        for resource in resources:
            weights[resource] = weights.get(resource, 0.0) + weight * count
            users.setdefault(resource, []).append(gid)
    order = {resource: i for i, resource in enumerate(weights)}
    version = dict.fromkeys(weights, 0)
    alive = {resource: len(gids) for resource, gids in users.items()}
    """Groups not yet frozen per resource: one whose groups are all frozen is no
    bottleneck, whatever float residue its weight keeps (weights of any scale)."""
    levels: list[tuple[float, int, str, int]] = [
        (left[r] / w, order[r], r, 0) for r, w in weights.items() if w > 1e-12]
    heapq.heapify(levels)
    caps = [(cap / weight, gid) for gid, (weight, cap, _, _) in groups.items()]
    heapq.heapify(caps)
    active = dict(groups)
    while active:
        while levels and levels[0][3] != version[levels[0][2]]:
            heapq.heappop(levels)
        level, bottleneck = (levels[0][0], levels[0][2]) if levels else (float("inf"), None)
        while caps and caps[0][1] not in active:
            heapq.heappop(caps)
        capped = []
        while caps and caps[0][0] <= level:
            gid = heapq.heappop(caps)[1]
            if gid in active:
                capped.append(gid)
        if capped:
            capped.sort()  # the groups' order, as a scan meets them
            frozen = [(gid, active[gid][1]) for gid in capped]
        elif bottleneck is not None:
            frozen = [(gid, level * active[gid][0]) for gid in users[bottleneck]
                      if gid in active]
        else:
            break
        touched: dict[str, None] = {}
        for gid, rate in frozen:
            rates[gid] = rate
            weight, _, resources, count = active.pop(gid)
            for resource in resources:
                left[resource] = max(0.0, left[resource] - rate * count)
                weights[resource] -= weight * count
                alive[resource] -= 1
                touched[resource] = None
        for resource in touched:
            version[resource] += 1
            if alive[resource] and weights[resource] > 1e-12:
                heapq.heappush(levels, (left[resource] / weights[resource], order[resource],
                                        resource, version[resource]))
    for gid in active:
        rates[gid] = 0.0
    return rates
