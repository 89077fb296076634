"""Closed-form iteration-time estimates (to rank candidate DC sets quickly), the number of
TCP connections that fill a link, and a lower bound on any schedule's iteration time."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.policy.api import (
    PAYLOAD_EFFICIENCY,
    HostLimits,
    Job,
    StageCost,
    Topology,
    in_flight_bytes,
    ring_allreduce_s,
    split_layers,
    stage_cost,
)

LINUX_DEFAULTS = HostLimits()
FILL_MARGIN = 1.5
"""Connections beyond the bare bandwidth-delay product: slow start and losses leave each
flow short of its window much of the time."""


def connections_to_fill(topology: Topology, src_dc: str, dst_dc: str,
                        limits: HostLimits = LINUX_DEFAULTS, limit: int = 0) -> int:
    """Enough connections that their windows cover the path's bandwidth-delay product,
    within what the hosts allow a worker (open files, TCP memory for full send buffers)
    and `limit` when positive."""
    if src_dc == dst_dc:
        return 1
    rtt = 2 * topology.one_way_latency(src_dc, dst_dc)
    bottleneck = topology.bottleneck_bps(src_dc, dst_dc)
    bdp = bottleneck * rtt / 8
    send_buffer = topology.tcp_for(src_dc).wmem[2]
    window = in_flight_bytes(topology.tcp_for(src_dc), topology.tcp_for(dst_dc), bottleneck)
    need = math.ceil(FILL_MARGIN * bdp / window)
    cap = limits.connections_per_peer(send_buffer)
    return max(1, min(need, cap, limit or need))


def transfer_s(topology: Topology, src_dc: str, dst_dc: str, nbytes: int,
               connections: int) -> float:
    """One transfer alone on the path, windows open: serialization plus propagation."""
    latency = topology.one_way_latency(src_dc, dst_dc)
    if src_dc == dst_dc:
        return nbytes * 8 / (topology.dc(src_dc).bandwidth_bps * PAYLOAD_EFFICIENCY)
    rtt = 2 * latency
    bottleneck = topology.bottleneck_bps(src_dc, dst_dc)
    window = in_flight_bytes(topology.tcp_for(src_dc), topology.tcp_for(dst_dc), bottleneck)
    rate = min(bottleneck * PAYLOAD_EFFICIENCY, connections * window * 8 / rtt)
    return latency + nbytes * 8 / rate


@dataclass(frozen=True)
class Estimate:
    iteration_s: float
    period_s: float
    """Steady-state time per microbatch: the slowest stage or the busiest WAN direction."""
    fill_s: float
    allreduce_s: float


def costs(topology: Topology, job: Job, stage_dcs: list[str], tp: int,
          microbatches: int) -> list[StageCost]:
    pp = len(stage_dcs)
    layers = split_layers(job.model.layers, pp)
    return [stage_cost(job, layers[s], s == 0, s == pp - 1, topology.dc(stage_dcs[s]).gpu, tp,
                       microbatches) for s in range(pp)]


def estimate(topology: Topology, job: Job, stage_dcs: list[str], dp: int, tp: int,
             connections: int | None, extra_warmup: int | Sequence[int] = 0,
             limits: HostLimits = LINUX_DEFAULTS) -> Estimate:
    """Iteration time of a pipeline with stages in `stage_dcs`: (m - 1) microbatch periods
    plus one pipeline fill, plus the intra-DC gradient all-reduce.

    A WAN direction carries dp transfers per microbatch; shared in time each goes at the
    rate its connections reach, and a period must fit all of them.
    """
    m = job.microbatches_for(dp)
    stage_costs = costs(topology, job, stage_dcs, tp, m)
    pp = len(stage_dcs)
    extras = [extra_warmup] * pp if isinstance(extra_warmup, int) else list(extra_warmup)
    period = max(c.total_s for c in stage_costs)
    fill = sum(c.total_s for c in stage_costs)
    hop = [0.0] * pp  # transfer time from stage s to s + 1 (either way)
    for s in range(pp - 1):
        a, b = stage_dcs[s], stage_dcs[s + 1]
        if a == b:
            continue
        n = connections if connections is not None else \
            connections_to_fill(topology, a, b, limits)
        one = transfer_s(topology, a, b, job.activation_bytes, n)
        hop[s] = one
        period = max(period, dp * (one - topology.one_way_latency(a, b)))
        fill += 2 * one
    for s in range(pp):
        # 1F1B keeps at most pp - s (+ extra warm-up) microbatches in flight at stage s:
        # each must go down the rest of the pipeline and come back before the next starts
        loop = sum(c.total_s for c in stage_costs[s:]) + 2 * sum(hop[s:])
        period = max(period, loop / min(m, pp - s + extras[s]))
    allreduce = max((ring_allreduce_s(c.grad_bytes, dp, topology.dc(stage_dcs[s]).bandwidth_bps
                                      * tp, topology.dc(stage_dcs[s]).latency_s)
                     for s, c in enumerate(stage_costs)), default=0.0)
    return Estimate((m - 1) * period + fill + allreduce, period, fill, allreduce)


def lower_bound(topology: Topology, job: Job, stage_dcs: list[str], dp: int, tp: int,
                waits_upstream: bool = True) -> float:
    """No schedule of its kind beats this. Each stage computes its m forwards and
    backwards; with `waits_upstream` (one stage per GPU, whole backwards: GPipe, 1F1B)
    after the first microbatch's forwards reach it and before the last one's gradient
    returns through the stages (and WAN crossings) upstream. Without it (several stages
    per GPU, or backwards split so weight gradients run after the gradient has passed:
    a GPU's first stage waits on a fraction of the GPUs upstream, and its own last work
    may run beside theirs) only the stage's own work counts. And the busiest WAN direction
    moves its dp x m activations at the link rate; then the intra-DC all-reduce."""
    m = job.microbatches_for(dp)
    stage_costs = costs(topology, job, stage_dcs, tp, m)
    compute = 0.0
    upstream = 0.0  # compute and propagation before a stage, both ways
    for s, cost in enumerate(stage_costs):
        if s and stage_dcs[s - 1] != stage_dcs[s] and waits_upstream:
            upstream += 2 * topology.one_way_latency(stage_dcs[s - 1], stage_dcs[s])
        compute = max(compute, upstream + m * cost.total_s)
        upstream += cost.total_s if waits_upstream else 0.0
    link = 0.0
    for s in range(len(stage_dcs) - 1):
        a, b = stage_dcs[s], stage_dcs[s + 1]
        if a != b:
            rate = topology.bottleneck_bps(a, b) * PAYLOAD_EFFICIENCY
            link = max(link, dp * m * job.activation_bytes * 8 / rate
                       + 2 * topology.one_way_latency(a, b))
    allreduce = max((ring_allreduce_s(c.grad_bytes, dp, topology.dc(stage_dcs[s]).bandwidth_bps
                                      * tp, topology.dc(stage_dcs[s]).latency_s)
                     for s, c in enumerate(stage_costs)), default=0.0)
    return max(compute, link) + allreduce
