"""Bubble filling: admission, bookkeeping, and the simulator's no-slowdown property."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.common.stats import percentile
from testbed.errors import PluginError
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.inference.bubbles import BubbleBroker, make_broker
from testbed.inference.workload import (
    PrefillModel,
    arrivals,
    dedicated_ttft,
    fit_prefill,
    predicted_bubbles,
)
from testbed.job.load import parse_job
from testbed.metrics.overruns import prefill_overruns
from testbed.plan.jitter import Jitter
from testbed.policy import Bubble, BubblePolicy, Request, bubble_policy, training_policy
from testbed.sim.simulate import simulate_plan

from .test_cli import call

ROOT = Path(__file__).resolve().parent.parent

requests = st.lists(st.builds(Request, st.integers(0, 10**6), st.floats(0, 10),
                              st.integers(1, 4096)), max_size=20,
                    unique_by=lambda r: r.id)


@given(st.floats(0, 10), st.floats(0, 5), st.floats(0, 5), requests,
       st.floats(1e-6, 1e-3), st.floats(0, 0.5), st.floats(0, 0.01))
def test_bubbletea_never_admits_past_the_predicted_end(start: float, waited: float,
                                                      length: float, queue: list[Request],
                                                      per_token: float, guard: float,
                                                      guard_s: float) -> None:
    policy = bubble_policy("bubbletea", {"guard": str(guard), "guard_s": str(guard_s)})
    now = start + waited
    bubble = Bubble("east-0", start, start + length)

    def prefill_time(n: int) -> float:
        return 0.001 + per_token * n

    chosen = policy.admit(bubble, queue, now, prefill_time)
    if chosen is not None:
        assert chosen in queue
        assert now + prefill_time(chosen.prompt_len) <= bubble.end
    elif queue:
        room = (bubble.end - now) * (1 - guard) - guard_s
        assert all(prefill_time(r.prompt_len) > room for r in queue)


def test_greedy_and_none() -> None:
    queue = [Request(2, 1.0, 100), Request(1, 0.5, 4000)]
    bubble = Bubble("g", 0.0, 0.0)  # no predicted room at all
    assert bubble_policy("greedy").admit(bubble, queue, 2.0, lambda n: 9.0) == queue[1]
    assert bubble_policy("none").admit(bubble, queue, 2.0, lambda n: 0.0) is None


def test_prefill_model_fits_a_quadratic_exactly() -> None:
    a, b, c = fit_prefill([(x, x * x, 0.5 + 0.01 * x + 1e-6 * x * x)
                           for x in (10, 100, 1000, 50)])
    assert (a, b, c) == pytest.approx((0.5, 0.01, 1e-6), rel=1e-6)
    model = PrefillModel({"a": 1.0, "b": 0.0, "c": 0.0})
    assert model(500) == 1.0
    for n in (100, 200, 400):
        model.observe(n, 0.002 * n)
    assert model(300) == pytest.approx(0.6, rel=1e-6)


def test_broker_predicts_the_median_recent_wait_and_rejects_late_requests() -> None:
    stream = iter([Request(0, 0.0, 100), Request(1, 0.1, 100), Request(2, 5.0, 100)])
    broker = BubbleBroker(bubble_policy("bubbletea", {"guard": "0", "guard_s": "0"}),
                          stream, PrefillModel({"a": 0.1, "b": 0.0, "c": 0.0}), deadline_s=2.0)
    assert broker.on_idle("g", 3, 0.2, 0.2) == ()  # no measured bubble yet
    for iteration, wait in enumerate((0.5, 0.3, 0.4, 0.9)):
        broker.record_wait("g", 3, iteration, wait)
    assert broker.predicted("g", 3) == 0.4  # the median of the last three: 0.3, 0.4, 0.9
    chosen = broker.on_idle("g", 3, 0.25, 0.2)  # room 0.35, prefill 0.1
    assert [c.request.id for c in chosen] == [0]
    broker.delivered(0, 0.5, 1000)
    broker.catch_up(3.0)  # request 1 waited 2.9 s > 2 s: rejected
    summary = broker.summary(6.0)
    assert summary["served"] == 1 and summary["rejected"] == 1 and summary["pending"] == 1
    assert summary["ttft_s"]["p50"] == pytest.approx(0.5)
    assert summary["kv_bytes"] == 1000


def test_arrivals_are_seeded_and_poisson() -> None:
    job = parse_job({"model": "tiny", "inference": {"arrival_rate": "50/s", "prompt_length": {
        "distribution": "uniform", "min": 10, "max": 20}}})
    assert job.inference is not None
    first = list(itertools.islice(arrivals(job.inference, 1), 5000))
    again = list(itertools.islice(arrivals(job.inference, 1), 5000))
    assert first == again
    rate = len(first) / first[-1].arrival
    assert 45 < rate < 55
    assert all(10 <= r.prompt_len <= 20 for r in first)


def test_dedicated_cluster_queues_first_come_first_served() -> None:
    reqs = [Request(i, 0.0, 1) for i in range(3)]
    ttft = dedicated_ttft(reqs, 1, lambda n: 1.0, lambda n: 0.5)
    assert ttft == [1.5, 2.5, 3.5]
    assert percentile(ttft, 0.5) == 2.5


def test_predicted_bubbles_from_spans() -> None:
    spans = [{"kind": "recv", "gpu": "g", "action": 4, "iteration": i, "start": 0.0,
              "end": d} for i, d in enumerate((0.2, 0.3, 0.1, 0.5))]
    assert predicted_bubbles(spans) == {("g", 4): 0.1}


def _simulate(bubble: str | None, rate: str) -> tuple[Any, Any, Any]:
    inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml",
                         sets=(f"inference.arrival_rate={rate}", "iterations=3"))
    # eager sends: with torch's, a stage waits on its own send after most receives, and
    # that wait hides a prefill's overrun, so greedy's would not show
    policy = training_policy("1f1b", {"sends": "eager"})
    plan = plan_with_simulator(policy, inputs.topology, inputs.job)
    broker = make_broker(inputs.topology, inputs.job, plan, bubble)
    # equal shares: the broker's bubbles are then the run's to the last digit (with drawn
    # shares its replicas' bubbles vary by a few percent, as real TCP's do)
    summary, spans = simulate_plan(inputs.topology, inputs.job, plan, policy, broker=broker,
                                   jitter=Jitter(share=0.0))
    return summary, broker, prefill_overruns(spans)


def test_bubbletea_fills_bubbles_without_slowing_training_in_the_simulator() -> None:
    none, _, _ = _simulate(None, "100")
    tea, broker, tea_overruns = _simulate("bubbletea", "100")
    greedy, _, greedy_overruns = _simulate("greedy", "100")
    # its prefills never hold a GPU past its bubble; their KV caches still cross WAN links
    # training uses, and where a full queue's losses set each connection's threshold
    # (testbed.sim.queues) that moves training's transfers by microseconds, which the
    # pipelines carry on: training neither waits for them nor moves by more than that
    assert tea.iteration_times == pytest.approx(none.iteration_times, rel=1e-2)
    assert tea.utilization_total > none.utilization_training + 0.1
    assert broker is not None and len(broker.ttft) > 100
    assert tea_overruns.prefills > 100 and tea_overruns.overran == 0
    # no prediction: greedy's prefills hold training up (whether that lengthens the
    # iteration depends on what else waits; staggering replicas can even shorten it)
    assert greedy_overruns.overran > 0
    assert greedy.iteration_times != pytest.approx(none.iteration_times, rel=1e-6)


def test_a_policy_that_never_fills_needs_no_room_for_the_inference_model(
        tmp_path: Path) -> None:
    paper = ROOT / "topologies" / "paper-3dc.yaml"
    assert not bubble_policy("none").fills and bubble_policy("greedy").fills
    # GPipe's first stage on paper-3dc cannot hold the inference model beside training
    code, _, err = call(["simulate", str(paper), "-p", "gpipe", "-b", "greedy",
                         "--iterations", "2", "--out", str(tmp_path / "greedy")])
    assert code == 2 and "filling bubbles does not fit" in err
    code, _, err = call(["simulate", str(paper), "-p", "gpipe", "-b", "none",
                         "--iterations", "2", "--out", str(tmp_path / "none")])
    assert code == 0, err
    results = json.loads((tmp_path / "none" / "results.json").read_text())
    assert results["status"] == "ok" and results["bubble_policy"] == "none"
    assert results["inference"]["requests"] > 0 and results["inference"]["served"] == 0


def test_the_broker_refuses_a_prefill_from_a_policy_that_never_fills() -> None:
    class Liar(BubblePolicy):
        name = "liar"
        fills = False

        def admit(self, bubble: Bubble, queue: Sequence[Request], now: float,
                  prefill_time: Callable[[int], float]) -> Request | None:
            return queue[0]

    broker = BubbleBroker(Liar(), iter([Request(0, 0.0, 100)]),
                          PrefillModel({"a": 0.1, "b": 0.0, "c": 0.0}), deadline_s=2.0)
    with pytest.raises(PluginError, match="bubble policy 'liar' admitted a prefill, though "
                       r"it declares it never fills \(fills = False\)"):
        broker.on_idle("g", 3, 0.2, 0.2)


def test_a_bubble_is_predicted_from_the_waits_seen_there_and_how_long_it_has_lasted(
        ) -> None:
    broker = BubbleBroker(bubble_policy("bubbletea"), iter([]),
                          PrefillModel({"a": 0.1, "b": 0.0, "c": 0.0}), deadline_s=2.0,
                          modeled_waits={("g", 3): 0.35})
    assert broker.predicted("g", 3) == 0.35  # the plan's modeled wait before any is measured
    broker.record_wait("g", 3, 0, 0.8)  # the first iteration: connections warm up
    assert broker.predicted("g", 3) == 0.35  # the warm-up's wait never counts
    assert broker.predicted("g", 3, elapsed=0.4) is None
    broker.record_wait("g", 3, 1, 0.3)
    assert broker.predicted("g", 3) == 0.3  # the shortest while fewer than three are known
    broker.record_wait("g", 3, 2, 0.5)
    assert broker.predicted("g", 3) == 0.3  # two measured: the modeled one no longer counts
    broker.record_wait("g", 3, 3, 0.4)
    assert broker.predicted("g", 3) == 0.4  # the median of 0.3, 0.5 and 0.4
    # a wait that has already lasted 0.45 s is one of the longer ones seen there
    assert broker.predicted("g", 3, elapsed=0.45) == 0.5
    assert broker.predicted("g", 3, elapsed=0.35) == 0.4
    assert broker.predicted("g", 3, elapsed=0.6) is None


def test_without_a_modeled_wait_the_first_iterations_waits_predict() -> None:
    broker = BubbleBroker(bubble_policy("bubbletea"), iter([]),
                          PrefillModel({"a": 0.1, "b": 0.0, "c": 0.0}), deadline_s=2.0)
    assert broker.predicted("g", 3) is None
    broker.record_wait("g", 3, 0, 0.8)
    assert broker.predicted("g", 3) == 0.8


def test_a_wait_the_model_puts_near_zero_is_not_filled_as_long_as_the_warm_ups() -> None:
    """The first iteration waited 0.13 s for a message that later arrives in time: a wait
    there that has lasted a moment is not the warm-up's again, and no prefill is admitted
    on its strength (one was, and held training up 5 DCs at 100 Gbit/s)."""
    broker = BubbleBroker(bubble_policy("bubbletea"), iter([Request(0, 0.0, 100)]),
                          PrefillModel({"a": 0.0001, "b": 0.0, "c": 0.0}), deadline_s=20.0,
                          modeled_waits={("g", 3): 0.0})
    broker.record_wait("g", 3, 0, 0.13)
    assert broker.predicted("g", 3, elapsed=0.001) is None
    assert not broker.on_idle("g", 3, 5.001, 5.0, iteration=1)
