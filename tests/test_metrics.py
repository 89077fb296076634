"""Metrics from spans, the arbiter's order, and the Chrome trace: pure, no network."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.errors import PluginError
from testbed.experiments.planning import plan_with_simulator
from testbed.job.load import parse_job
from testbed.metrics.summary import (
    busy_time,
    iteration_ends,
    median_at_least,
    slower_after,
    summarize,
)
from testbed.plan.model import Op
from testbed.policy import Transfer, training_policy
from testbed.policy.arbiter import Arbiter
from testbed.report.chrome import trace_events
from testbed.topology import parse_topology

TOPO = parse_topology(
    {
        "datacenters": [{"name": "east", "gpus": 2}, {"name": "west", "gpus": 2}],
        "wan": [{"between": ["east", "west"], "latency": "20ms", "bandwidth": "1Gbit"}],
    },
    "t.yaml",
)


def span(
    gpu: str, kind: str, start: float, end: float, iteration: int = 0, **extra: Any
) -> dict[str, Any]:
    return {"gpu": gpu, "kind": kind, "start": start, "end": end, "iteration": iteration, **extra}


def test_iterations_end_at_the_last_step() -> None:
    spans = [
        span("a", "step", 0.9, 1.0, 0),
        span("b", "step", 1.1, 1.2, 0),
        span("a", "step", 2.0, 2.1, 1),
        span("b", "step", 2.2, 2.3, 1),
        span("a", "step", 3.0, 3.1, 2),
    ]  # b never finished iteration 2
    assert iteration_ends(spans, ["a", "b"]) == [1.2, 2.3]


def test_summary_numbers() -> None:
    spans = []
    for it in range(3):
        base = it * 1.0
        for gpu in ("a", "b"):
            spans.append(span(gpu, "forward", base, base + 0.25, it))
            spans.append(span(gpu, "step", base + 0.9, base + 1.0, it))
    spans.append(span("b", "transfer", 1.2, 1.4, 1, bytes=10**8, link="east>west"))
    summary = summarize(
        spans, ["a", "b"], start=0.0, tokens_per_iteration=1000, wan_capacity_bps=1e9
    )
    assert summary.iteration_times == pytest.approx([1.0, 1.0, 1.0])
    assert summary.median_s == pytest.approx(1.0)
    assert summary.tokens_per_s == pytest.approx(1000)
    assert summary.utilization_training == pytest.approx(0.35)
    assert summary.wan_bytes == 10**8
    assert summary.wan_utilization == pytest.approx(0.4)


def uneven_spans(lengths: Sequence[float], gpus: Sequence[str] = ("a", "b")
                 ) -> list[dict[str, Any]]:
    """Iterations of these lengths back to back from 0, each ending in a step per GPU: a
    plan that syncs every few steps has a long iteration among short ones."""
    spans, end = [], 0.0
    for it, length in enumerate(lengths):
        end += length
        spans += [span(gpu, "step", end - 0.01, end, it) for gpu in gpus]
    return spans


def test_tokens_per_s_is_tokens_over_time_when_iterations_differ() -> None:
    # a warm-up iteration, then nine short inner steps and one long one with a sync
    lengths = [2.0] + [0.5] * 9 + [10.0]
    summary = summarize(uneven_spans(lengths), ["a", "b"], start=0.0,
                        tokens_per_iteration=1000, wan_capacity_bps=0.0)
    assert summary.median_s == pytest.approx(0.5)  # 2,000 tokens/s by the median
    assert summary.tokens_per_s == pytest.approx(10 * 1000 / (9 * 0.5 + 10.0))  # 690
    assert summary.tokens_measured == 10_000 and summary.tokens_total == 11_000
    assert summary.measured_s == pytest.approx(14.5)
    assert summary.iteration_ends_s == pytest.approx([2.0 + 0.5 * i for i in range(10)]
                                                     + [16.5])
    assert summary.as_results()["tokens"] == {"measured": 10_000, "total": 11_000,
                                              "measured_s": pytest.approx(14.5)}
    one = summarize(uneven_spans([4.0]), ["a", "b"], 0.0, 1000, 0.0)  # nothing to exclude
    assert one.tokens_per_s == pytest.approx(250) and one.tokens_measured == 1000


def test_a_cycles_typical_iteration_is_its_mean_not_the_step_without_the_sync() -> None:
    """The figure the emulator is compared with the simulator by: a DiLoCo-style cycle's
    median is an inner step, which says nothing of the sync."""
    lengths = [2.0] + ([0.5] * 4 + [10.0]) * 2
    cycled = summarize(uneven_spans(lengths), ["a", "b"], 0.0, 1000, 0.0, period=5)
    assert cycled.median_s == pytest.approx(0.5)
    assert cycled.typical_s == pytest.approx(2.4) == cycled.mean_s
    plain = summarize(uneven_spans(lengths), ["a", "b"], 0.0, 1000, 0.0)
    assert plain.typical_s == plain.median_s


@given(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 2)), max_size=20))
def test_busy_time_merges_overlaps(intervals: Sequence[tuple[float, float]]) -> None:
    spans = [span("a", "forward", s, s + d) for s, d in intervals]
    busy = busy_time(spans, ["forward"], 0.0, 20.0)
    assert busy <= sum(d for _, d in intervals) + 1e-9
    assert busy <= 20.0
    if intervals:
        assert busy >= max(d for _, d in intervals) - 1e-9


def _transfer(
    i: int, replica: int, ready: float, link: tuple[str, str] = ("east", "west")
) -> Transfer:
    return Transfer(
        i,
        f"{link[0]}-{replica}",
        f"{link[1]}-{replica}",
        link[0],
        link[1],
        Op.SEND_F,
        replica,
        0,
        0,
        1000,
        ready,
    )


def test_arbiter_serves_one_at_a_time_in_policy_order() -> None:
    job = parse_job({"model": "tiny"})
    policy = training_policy("gpipe")
    plan = plan_with_simulator(policy, TOPO, job)
    arbiter = Arbiter(policy, plan)
    first = arbiter.request(_transfer(1, 0, 0.0))
    assert first is not None  # link free: granted
    assert arbiter.request(_transfer(2, 1, 0.2)) is None  # busy: waits
    assert arbiter.request(_transfer(3, 0, 0.1)) is None
    other = arbiter.request(_transfer(4, 0, 0.3, ("west", "east")))
    assert other is not None  # the other direction is free
    nxt = arbiter.release(first)
    assert nxt is not None and nxt.id == 3  # first come, first served
    last = arbiter.release(nxt)
    assert last is not None and last.id == 2
    assert arbiter.release(last) is None


def test_arbiter_reports_a_misbehaving_policy() -> None:
    job = parse_job({"model": "tiny"})
    policy = training_policy("gpipe")
    plan = plan_with_simulator(policy, TOPO, job)

    class Bad(type(policy)):  # type: ignore[misc]
        def next_transfer(self, plan: Any, link: Any, waiting: Any) -> Transfer:
            return _transfer(99, 0, 0.0)

    arbiter = Arbiter(Bad(), plan)
    with pytest.raises(PluginError, match="not waiting"):
        arbiter.request(_transfer(1, 0, 0.0))


def test_arbiter_takes_the_waiting_transfer_a_policy_names_by_an_equal_copy() -> None:
    job = parse_job({"model": "tiny"})
    policy = training_policy("gpipe")
    plan = plan_with_simulator(policy, TOPO, job)

    class Copying(type(policy)):  # type: ignore[misc]
        def next_transfer(self, plan: Any, link: Any, waiting: Any) -> Transfer:
            return dataclasses.replace(max(waiting, key=lambda t: t.id))

    arbiter = Arbiter(Copying(), plan)
    first = arbiter.request(_transfer(1, 0, 0.0))
    second, third = _transfer(2, 0, 0.1), _transfer(3, 0, 0.2)
    assert arbiter.request(second) is None and arbiter.request(third) is None
    assert arbiter.release(first) is third  # the one waiting, not the policy's copy
    assert arbiter.release(third) is second  # released: the lane is free again
    assert arbiter.release(second) is None


def test_chrome_trace_has_tracks_and_flows() -> None:
    spans = [
        span("east-0", "forward", 1.0, 1.5, microbatch=0, stage=0),
        span("west-0", "transfer", 1.5, 1.6, bytes=8, src="east-0", dst="west-0", link="east>west"),
    ]
    events = list(trace_events(spans, 1.0, TOPO))
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"east", "west", "east-0", "west-0"} <= names
    complete = [e for e in events if e["ph"] == "X"]
    assert complete[0]["name"] == "0F0" and complete[0]["dur"] == pytest.approx(500000)
    assert [e["ph"] for e in events if e["ph"] in "sf"] == ["s", "f"]
    json.dumps(events)


def test_a_run_under_way_bounds_its_median_iteration_from_below() -> None:
    # 3 iterations (the first does not count): after the first ended at 2 s, the median of
    # the other two is at least half of what has passed since
    assert median_at_least(0.0, [2.0], 3, 5.0) == 1.5
    assert median_at_least(0.0, [], 3, 100.0) == 0.0  # only the uncounted one so far
    assert median_at_least(0.0, [2.0, 3.0, 7.0], 3, 9.0) == 2.5  # done: the median itself
    # the earliest time it is sure to exceed 1.5 s: 2 + 2 x 1.5
    assert slower_after(0.0, [2.0], 3, 1.5) == pytest.approx(5.0)
    assert median_at_least(0.0, [2.0], 3, slower_after(0.0, [2.0], 3, 1.5)) > 1.5
    assert slower_after(0.0, [], 3, 1.0) == float("inf")
    # 5 iterations, two counted ones known short: the remaining can't lift the median yet
    assert slower_after(0.0, [1.0, 1.1, 1.2], 5, 10.0) == float("inf")
    assert slower_after(0.0, [1.0], 2, 0.5) == pytest.approx(1.5)
