"""Atlas placement ("Algorithm 1"): pipeline stages across DCs, every DP replica of a stage
(and its TP group) inside one DC, whole stages per DC, largest DC first. Pure."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.policy.api import InputError, Topology, Worker


@dataclass(frozen=True)
class Chain:
    """DCs in pipeline order and how many stages each hosts."""

    dcs: tuple[str, ...]
    stages: tuple[int, ...]

    def stage_dcs(self) -> list[str]:
        return [dc for dc, count in zip(self.dcs, self.stages, strict=True) for _ in range(count)]


def largest_first(topology: Topology, dcs: Sequence[str] | None = None) -> list[str]:
    """DCs by free GPUs, largest first; ties keep file order."""
    names = list(dcs) if dcs is not None else [dc.name for dc in topology.datacenters]
    return sorted(names, key=lambda n: -topology.dc(n).gpus)


def fill(topology: Topology, order: Sequence[str], pp: int, dp: int, tp: int) -> Chain:
    """Each DC in `order` takes floor(gpus / (tp x dp)) consecutive stages until all `pp`
    are placed. Raises InputError naming how many GPUs are missing where."""
    taken: list[tuple[str, int]] = []
    left = pp
    for name in order:
        if left == 0:
            break
        capacity = topology.dc(name).gpus // (tp * dp)
        count = min(capacity, left)
        if count:
            taken.append((name, count))
            left -= count
    if left:
        per_stage = tp * dp
        detail = ", ".join(f"{n} has {topology.dc(n).gpus} GPUs = "
                           f"{topology.dc(n).gpus // per_stage} stages" for n in order)
        raise InputError(
            f"{pp} stages of dp {dp} x tp {tp} = {per_stage} GPUs each do not fit: {left} "
            f"stages ({left * per_stage} GPUs) are missing ({detail})", topology.source, "job")
    return Chain(tuple(n for n, _ in taken), tuple(c for _, c in taken))


def place(topology: Topology, chain: Chain, dp: int, tp: int
          ) -> dict[Worker, tuple[str, ...]]:
    """GPUs for every (replica, stage): a DC's stages side by side, replicas within each."""
    placement: dict[Worker, tuple[str, ...]] = {}
    stage = 0
    for name, count in zip(chain.dcs, chain.stages, strict=True):
        hosts = topology.dc(name).host_names()
        for local in range(count):
            for replica in range(dp):
                first = (local * dp + replica) * tp
                placement[(replica, stage)] = tuple(hosts[first:first + tp])
            stage += 1
    return placement


def capacity(topology: Topology, dcs: Sequence[str], dp: int, tp: int) -> int:
    """Whole stages these DCs can host at this data-parallel degree."""
    return sum(topology.dc(n).gpus // (tp * dp) for n in dcs)


def tie_orders(topology: Topology, base: list[str]) -> list[list[str]]:
    """Orders that keep larger DCs before smaller ones but permute DCs of equal size."""
    groups = [list(g) for _, g in itertools.groupby(base, key=lambda n: topology.dc(n).gpus)]
    if math.prod(math.factorial(len(g)) for g in groups) > 720:
        return [base]
    orders: list[list[str]] = [[]]
    for group in groups:
        orders = [o + list(p) for o in orders for p in itertools.permutations(group)]
    return orders
