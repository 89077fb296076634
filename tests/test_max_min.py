"""Max-min sharing's heaps (testbed.sim.max_min) against the scan they replaced: the same
rates to the bit, ties included, on random groups of flows over shared resources."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.sim.max_min import _fill, max_min


def _scan_fill(
    groups: dict[int, tuple[float, float, tuple[str, ...], int]], capacity: dict[str, float]
) -> dict[int, float]:
    """Progressive filling by scanning every resource and group per step (the reference)."""
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


RESOURCES = [f"r{i}" for i in range(8)]


@st.composite
def _groups(draw: st.DrawFn) -> tuple[dict[int, tuple[float, float, tuple[str, ...], int]],
                                      dict[str, float]]:
    n = draw(st.integers(1, 30))
    small = st.sampled_from([1.0, 2.0, 3.0, 0.5, 0.25])  # ties on purpose
    weight = small | st.floats(0.01, 100.0)
    cap = st.sampled_from([float("inf"), 1.0, 2.0, 4.0]) | st.floats(0.01, 1e3)
    groups = {g: (draw(weight), draw(cap),
                  tuple(draw(st.lists(st.sampled_from(RESOURCES), min_size=1, max_size=4,
                                      unique=True))),
                  draw(st.integers(1, 4))) for g in range(n)}
    capacity = {r: draw(st.sampled_from([1.0, 2.0, 10.0]) | st.floats(0.0, 1e3))
                for r in RESOURCES}
    return groups, capacity


@settings(max_examples=400, deadline=None)
@given(case=_groups())
def test_heaps_give_the_scans_rates_to_the_bit(
        case: tuple[dict[int, tuple[float, float, tuple[str, ...], int]], dict[str, float]]
) -> None:
    groups, capacity = case
    assert _fill(groups, capacity) == _scan_fill(groups, capacity)


def test_many_distinct_flows_share_in_one_solve() -> None:
    """Ten thousand flows, each over a NIC of its own pair and one of ten links: every
    link's flows split it evenly (the NICs do not bind)."""
    flows = {i: (1.0, float("inf"), (f"up{i % 500}", f"link{i % 10}", f"down{i % 499}"))
             for i in range(10_000)}
    capacity = {f"link{i}": 1e9 for i in range(10)}
    capacity |= {f"up{i}": 1e10 for i in range(500)} | {f"down{i}": 1e10 for i in range(499)}
    rates = max_min(flows, capacity)
    assert set(rates.values()) == {1e9 / 1000}


def test_a_resource_whose_flows_all_froze_is_no_bottleneck() -> None:
    """Large weights (a short round trip's, RTT^-a) leave a float residue of their sum on
    a resource once its flows froze: it must not stop the filling (a scan by weight alone
    met it forever). Here the residue of 330000 + 330000 + 4712.3 is 4.6e-11."""
    inf = float("inf")
    groups = {0: (330000.0, inf, ("a", "r"), 1), 1: (330000.0, inf, ("a", "r"), 1),
              2: (4712.3, inf, ("a", "r"), 1), 3: (1.0, inf, ("b",), 1)}
    rates = _fill(groups, {"a": 1.0, "r": 100.0, "b": 5.0})
    assert rates[3] == 5.0
    assert sum(rates[g] for g in range(3)) == pytest.approx(1.0)
