"""The simulator on the DiLoCo family's syncs as their papers run them: buckets that start
in the backward (torch DDP's), syncs ordered on the WAN, eager outer steps that overlap a
whole outer step."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from testbed.common.spans import Span
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.plan.buckets import bucket_ready
from testbed.plan.collective import Collective
from testbed.plan.jitter import Jitter
from testbed.plan.model import Plan
from testbed.policy import training_policy
from testbed.policy.base import Transfer, first_layers_first
from testbed.sim.simulate import simulate_plan

EQUAL_SHARES = Jitter(share=0.0)

ROOT = Path(__file__).resolve().parent.parent
PAPER = load_inputs(ROOT / "topologies" / "paper-3dc.yaml", sets=("model=gpt2",))
"""paper-3dc with GPT-2 (124M parameters): a sync of seconds, compute of tenths."""


def _run(policy: str, iterations: int, jitter: Jitter | None = None,
         **options: str) -> tuple[Plan, Any, Sequence[Span]]:
    chosen = training_policy(policy, dict(options))
    job = replace(PAPER.job, iterations=iterations)
    plan = plan_with_simulator(chosen, PAPER.topology, job)
    summary, spans = simulate_plan(PAPER.topology, job, plan, chosen, jitter=jitter)
    return plan, summary, spans


def test_a_bucket_joins_its_all_reduce_as_the_backward_has_its_values() -> None:
    plan, _, spans = _run("dp-across-dc", 2, bucket_mb="25")
    gpu = plan.lead_gpu(0, 1)
    backward = max((s for s in spans if s["kind"] == "backward" and s["gpu"] == gpu
                    and s["iteration"] == 1), key=lambda s: s["start"])
    rings = sorted((s for s in spans if s["kind"] == "allreduce" and s["gpu"] == gpu
                    and s["iteration"] == 1), key=lambda s: s["start"])
    assert len(rings) > 1
    for ring in rings:
        collective = Collective.parse(ring["collective"])
        ready = bucket_ready(PAPER.job.model, plan.layers, 1, collective)
        assert ring["start"] == pytest.approx(
            backward["start"] + ready * (backward["end"] - backward["start"]), abs=1e-9)
        assert ring["start"] <= backward["end"]


def test_buckets_are_faster_than_one_all_reduce_after_the_backward() -> None:
    """Reducing while the backward goes on, and each bucket's ring going on while the
    next one's steps start (one ring waits at each of its 2(n - 1) steps for its slowest
    hop, buckets keep the links busy meanwhile): faster than one all-reduce after it."""
    _, whole, _ = _run("dp-across-dc", 3, bucket_mb="0")
    _, bucketed, _ = _run("dp-across-dc", 3)
    assert bucketed.median_s < whole.median_s


def test_ordered_syncs_cross_a_link_one_at_a_time_the_first_layers_first() -> None:
    plan, _, spans = _run("dp-across-dc", 2, sync_order="first-layers")
    assert plan.sync_order.arbitrated
    by_link: dict[str, list[Span]] = {}
    for span in spans:
        link = span.get("link")
        if span["kind"] == "send" and link and span["iteration"] == 1:
            by_link.setdefault(link, []).append(span)
    for sends in by_link.values():
        sends.sort(key=lambda s: s["start"])
        for earlier, later in itertools.pairwise(sends):
            assert later["start"] >= earlier["end"] - 1e-9  # never two at once


def test_first_layers_first_orders_by_stage_fragment_and_bucket() -> None:
    def transfer(i: int, stage: int, collective: str | None) -> Transfer:
        return Transfer(i, "a", "b", "east", "west", "ALLREDUCE", 0, stage,  # type: ignore[arg-type]
                        -1, 1, float(-i), 0,
                        Collective.parse(collective) if collective is not None else None)

    waiting = [transfer(1, 1, "b0/4"), transfer(2, 0, "b0/4"), transfer(3, 0, "b3/4"),
               transfer(4, 0, "delta,f1/2"), transfer(5, 2, None)]
    order = []
    while waiting:
        chosen = first_layers_first(waiting)
        order.append(chosen.id)
        waiting.remove(chosen)
    assert order == [5, 3, 2, 4, 1]


def test_an_eager_sync_costs_nothing_while_it_ends_within_the_next_outer_step() -> None:
    """Blocking DiLoCo waits for its sync every H steps; an eager one starts it and goes
    on, and waits for it only H steps later, by when it has ended: its cycle is H steps'
    compute, the blocking one's that and the sync. The first sync runs on connections
    still in slow start and may outlast its outer step: the waits counted are the later
    ones'."""
    global PAPER
    plain, PAPER = PAPER, load_inputs(ROOT / "topologies" / "paper-3dc.yaml",
                                      sets=("model=gpt2", "microbatch_size=16",
                                            "global_batch=768"))
    try:
        h = 8
        # equal shares: each ring's chunks then take the same time every sync, so the
        # eager cycle is exactly H steps' compute (drawn shares vary the syncs)
        _, blocking, spans = _run("diloco", 4 * h, EQUAL_SHARES, inner_steps=str(h),
                                  bucket_mb="0")
        _, eager, eager_spans = _run("diloco", 4 * h, EQUAL_SHARES, inner_steps=str(h),
                                     eager="on", bucket_mb="0")
    finally:
        PAPER = plain
    step = min(blocking.iteration_times)
    waited = [s["end"] - s["start"] for s in eager_spans
              if s["kind"] == "wait_reduce" and s["iteration"] >= 2 * h]
    assert waited and max(waited) < 0.01 * step
    assert eager.cycle_s == pytest.approx(h * step, rel=0.01)
    sync = min(s["end"] - s["start"] for s in spans if s["kind"] == "allreduce")
    assert blocking.cycle_s >= h * step + sync
