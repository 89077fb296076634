"""Weighted max-min fair sharing of link capacity among flows, the flow model's rate rule
(testbed.sim.network). Pure."""

from __future__ import annotations


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
