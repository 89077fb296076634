"""Batched and chunked prefill: the time model, BubbleTea's passes, the broker's
bookkeeping, the simulator serving prompts longer than any bubble, all-reduce and
first-iteration bubbles, the memory check, and real chunked prefill in torch."""

from __future__ import annotations

import dataclasses
import functools
import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.errors import InputError, PluginError
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.inference.bubbles import BubbleBroker, make_broker
from testbed.inference.memory import check_inference_memory, in_flight_of
from testbed.inference.workload import PrefillModel, fit_prefill
from testbed.job.model import MODEL_PRESETS
from testbed.metrics.overruns import prefill_overruns
from testbed.plan.compute import prefill_flops
from testbed.policy import Bubble, BubblePolicy, Request, bubble_policy, training_policy
from testbed.policy.api import Chunk
from testbed.sim.bubble_seed import modeled_waits
from testbed.sim.simulate import simulate_plan

from .test_cli import call

pytestmark = pytest.mark.usefixtures("shared_planning")

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "topologies" / "paper-3dc.yaml"


def test_a_prompts_chunks_add_up_to_the_whole_prompt() -> None:
    model = MODEL_PRESETS["llama2-7b"]
    head = prefill_flops(model, 5, 5)  # no tokens: the head's one prediction alone
    whole = prefill_flops(model, 1000)
    parts = prefill_flops(model, 300) + prefill_flops(model, 1000, 300)
    assert parts - whole == pytest.approx(head)  # each chunk predicts one token
    assert 0 < head < 1e-3 * whole
    assert prefill_flops(model, 2000, 1000) > prefill_flops(model, 1000)  # attention grows


def test_a_prefill_costs_the_model_s_own_mlp() -> None:
    swiglu = MODEL_PRESETS["llama2-7b"]
    gelu = dataclasses.replace(swiglu, mlp="gelu")
    n, h = 1000, swiglu.hidden
    third_matrix = swiglu.layers * 2 * n * h * swiglu.ffn_hidden
    assert prefill_flops(swiglu, n) - prefill_flops(gelu, n) == pytest.approx(third_matrix)
    layers = swiglu.layers * (2 * n * swiglu.params_per_layer + 4 * n * n * h)
    assert prefill_flops(swiglu, n) == pytest.approx(layers + 2 * h * swiglu.vocab)


def test_the_prefill_model_times_chunks_and_batches_and_learns_from_them() -> None:
    truth = (0.01, 2e-4, 1e-8)
    model = PrefillModel({"a": 0.0, "b": 1e-4, "c": 0.0})
    passes = [[(0, 500)], [(0, 100), (0, 300)], [(200, 900)], [(0, 50), (400, 1200)]]
    for spans in passes:
        chunks = [Chunk(Request(i, 0.0, end), start, end) for i, (start, end) in enumerate(spans)]
        tokens = sum(e - s for s, e in spans)
        squares = sum(e * e - s * s for s, e in spans)
        model.observe_batch(chunks, truth[0] + truth[1] * tokens + truth[2] * squares)
    assert model.coefficients == pytest.approx(truth, rel=1e-6)
    a, _, _ = truth
    assert model.chunk(0, 400) + model.chunk(400, 1000) == pytest.approx(model(1000) + a)
    pair = [Chunk(Request(0, 0, 300), 0, 300), Chunk(Request(1, 0, 200), 0, 200)]
    assert model.batch(pair) == pytest.approx(model(300) + model(200) - a)
    assert fit_prefill([(1, 1, 2.0)]) == (2.0, 0.0, 0.0)  # too few points: the mean


queued = st.lists(st.builds(Request, st.integers(0, 10**6), st.floats(0, 10),
                            st.integers(1, 6000)), max_size=12, unique_by=lambda r: r.id)


@given(queued, st.integers(0, 5000), st.floats(0, 2), st.floats(1e-6, 1e-3),
       st.integers(1, 8), st.sampled_from(["on", "off"]), st.integers(64, 8192))
def test_bubbletea_passes_fit_the_bubble_and_the_contract(
        queue: list[Request], done: int, length: float, per_token: float, batch: int,
        chunk: str, max_tokens: int) -> None:
    if queue and done:  # the oldest is chunked on this GPU already
        first = queue[0]
        queue[0] = dataclasses.replace(first, prefilled=min(done, first.prompt_len - 1))
    queue.sort(key=lambda r: (r.prefilled == 0, r.arrival, r.id))  # as the broker offers it
    policy = bubble_policy("bubbletea", {"batch": str(batch), "chunk": chunk})
    model = PrefillModel({"a": 0.001, "b": per_token, "c": 1e-9})
    chunks = policy.admit_batch(Bubble("g", 0.0, length), queue, 0.0, model, max_tokens)
    room = length * 0.9 - 0.002
    if chunks:
        assert model.batch(chunks) <= room
    assert sum(c.tokens for c in chunks) <= max_tokens
    assert len(chunks) <= batch
    assert len({c.request.id for c in chunks}) == len(chunks)
    for c in chunks:
        assert c.request in queue and c.start == c.request.prefilled < c.end
    if chunk == "off":
        assert all(c.last for c in chunks)
    partial = [c for c in chunks if not c.last]
    assert len(partial) <= 1
    if partial and not partial[0].request.prefilled:  # never a second prompt under way
        finished = {c.request.id for c in chunks if c.last}
        assert all(r.id in finished for r in queue if r.prefilled)


class Tokens(BubblePolicy):
    """Admits what it is told, to check the broker's contract."""

    name = "scripted"

    def __init__(self, answer: Any) -> None:
        super().__init__()
        self.answer = answer

    def admit(self, bubble: Bubble, queue: Any, now: float, prefill_time: Any) -> None:
        return None

    def admit_batch(self, bubble: Bubble, queue: Any, now: float, prefill: Any,
                    max_tokens: int) -> Any:
        return self.answer(queue)


def _broker(policy: BubblePolicy, requests: list[Request], max_tokens: int = 1000
            ) -> BubbleBroker:
    return BubbleBroker(policy, iter(requests), PrefillModel({"a": 0.0, "b": 1e-4, "c": 0.0}),
                        deadline_s=10.0, max_batch_tokens=max_tokens,
                        modeled_waits={("g", 1): 1.0, ("h", 1): 1.0})


def test_the_broker_keeps_a_chunked_prompt_on_its_gpu_until_its_last_chunk() -> None:
    long = Request(0, 0.0, 25_000)  # 2.5 s of prefill: longer than any 1 s bubble
    broker = _broker(bubble_policy("bubbletea", {"guard": "0", "guard_s": "0"}), [long],
                     max_tokens=10_000)
    first = broker.on_idle("g", 1, 0.0, 0.0)
    assert [(c.start, c.end) for c in first] == [(0, 10_000)]  # the token budget binds
    assert broker.on_idle("h", 1, 0.5, 0.5) == ()  # its KV cache is on g
    second = broker.on_idle("g", 1, 2.0, 2.0)
    assert second[0].request.prefilled == 10_000 and second[0].start == 10_000
    third = broker.on_idle("g", 1, 4.0, 4.0)
    assert third[0].last and third[0].end == 25_000
    broker.delivered(0, 5.0)
    summary = broker.summary(6.0)
    assert summary["served"] == 1 and summary["chunked"] == 1
    assert broker.on_idle("g", 1, 6.0, 6.0) == ()


@pytest.mark.parametrize(("answer", "problem"), [
    (lambda q: [Chunk(q[0], 0, 10), Chunk(q[0], 0, 10)], "twice"),
    (lambda q: [Chunk(Request(9, 0.0, 10), 0, 10)], "not queued"),
    (lambda q: [Chunk(q[0], 5, 10)], "does not start"),
    (lambda q: [Chunk(q[0], 0, 0)], "does not start"),
    (lambda q: [Chunk(q[0], 0, 2000)], "max_batch_tokens"),
])
def test_the_broker_refuses_a_pass_outside_the_contract(answer: Any, problem: str) -> None:
    broker = _broker(Tokens(answer), [Request(0, 0.0, 2000)])
    with pytest.raises(PluginError, match=problem):
        broker.on_idle("g", 1, 0.0, 0.0)


def test_a_policy_written_for_admit_alone_runs_whole_prompts_within_the_budget() -> None:
    broker = _broker(bubble_policy("greedy"), [Request(0, 0.0, 5000), Request(1, 0.1, 10)])
    assert [c.request.id for c in broker.on_idle("g", 1, 1.0, 1.0)] == [1]  # 0 is too long


@functools.cache
def _paper(*sets: str) -> tuple[Any, Any, Any]:
    inputs = load_inputs(PAPER, sets=("iterations=3", *sets))
    policy = training_policy("atlas")
    return inputs, policy, plan_with_simulator(policy, inputs.topology, inputs.job)


def _run(bubbles: str | None, options: dict[str, str], *sets: str) -> tuple[Any, Any, Any]:
    inputs, policy, plan = _paper(*sets)
    seed = modeled_waits(inputs.topology, inputs.job, plan, policy)
    broker = make_broker(inputs.topology, inputs.job, plan, bubbles, options, seed)
    summary, spans = simulate_plan(inputs.topology, inputs.job, plan, policy, broker=broker)
    return summary, broker, spans


LONG = ("inference.arrival_rate=20", "inference.prompt_length.min=30000",
        "inference.prompt_length.max=30000", "inference.model.seq_len=32768",
        "inference.deadline=60s")


def test_chunked_prefill_serves_prompts_longer_than_any_bubble() -> None:
    none, _, _ = _run(None, {}, *LONG)
    whole, whole_broker, _ = _run("bubbletea", {"chunk": "off"}, *LONG)
    chunked, broker, spans = _run("bubbletea", {}, *LONG)
    assert not whole_broker.ttft  # no bubble holds a whole prompt
    assert broker.chunked > 5 and len(broker.ttft) == broker.chunked
    assert chunked.iteration_times == pytest.approx(none.iteration_times, rel=1e-9)
    assert prefill_overruns(spans).overran == 0
    assert chunked.utilization_total > whole.utilization_total + 0.2


def test_bubbles_of_the_first_iteration_are_filled_from_the_plans_model() -> None:
    none, _, _ = _run(None, {}, "inference.arrival_rate=100")
    tea, _, spans = _run("bubbletea", {}, "inference.arrival_rate=100")
    assert any(s["kind"] == "prefill" and s["iteration"] == 0 for s in spans)
    assert tea.iteration_times == pytest.approx(none.iteration_times, rel=1e-9)
    assert prefill_overruns(spans).overran == 0


def test_all_reduce_waits_are_filled() -> None:
    inputs = load_inputs(PAPER, sets=("iterations=2", "inference.arrival_rate=50"))
    policy = training_policy("1f1b")
    plan = plan_with_simulator(policy, inputs.topology, inputs.job)
    broker = make_broker(inputs.topology, inputs.job, plan, "bubbletea", {},
                         modeled_waits(inputs.topology, inputs.job, plan, policy))
    _, spans = simulate_plan(inputs.topology, inputs.job, plan, policy, broker=broker)
    reduces = [s for s in spans if s["kind"] == "allreduce" and s["end"] > s["start"]]
    prefills = [s for s in spans if s["kind"] == "prefill"]
    inside = [p for p in prefills for r in reduces
              if p["gpu"] == r["gpu"] and r["start"] <= p["start"] < r["end"]]
    assert reduces and inside


def test_a_plan_that_cannot_hold_the_inference_model_is_refused() -> None:
    inputs = load_inputs(PAPER)
    plan = plan_with_simulator(training_policy("gpipe"), inputs.topology, inputs.job)
    assert in_flight_of(plan, plan.lead_gpu(0, 0)) == plan.microbatches
    # the 7B SwiGLU model's 5.7B bf16 weights and the KV cache of 512 + 8192 tokens
    with pytest.raises(InputError, match=r"stage 0 .* 72\.7 GiB .* 10\.7 GiB more"):
        check_inference_memory(inputs.topology, inputs.job, plan)
    check_inference_memory(inputs.topology, dataclasses.replace(inputs.job, inference=None),
                           plan)
    code, _, err = call(["simulate", str(PAPER), "-p", "gpipe", "-b", "bubbletea"])
    assert code == 2 and "job.inference: filling bubbles does not fit" in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_real_chunked_prefill_gives_the_whole_prompts_kv_cache_and_first_token() -> None:
    import torch

    from testbed.emulator.runtime.worker.compute.prefill import Prefiller

    shape = dataclasses.replace(MODEL_PRESETS["tiny"], kv_heads=2)
    prefiller = Prefiller(shape, seed=3, device=torch.device("cpu"))
    whole = prefiller.run(7, 30)
    assert prefiller.run(7, 30, 0, 11) is None
    assert prefiller.run(7, 30, 11, 19) is None
    chunked = prefiller.run(7, 30, 19, 30)
    assert whole is not None and chunked is not None and len(whole) == len(chunked)
    as_floats = [torch.frombuffer(bytearray(b[:-8]), dtype=torch.bfloat16).float()
                 for b in (whole, chunked)]
    assert torch.allclose(*as_floats, atol=2e-2)
    assert whole[-8:] == chunked[-8:]  # the same first token
    assert not prefiller._cache  # nothing kept once the prompt is done


def test_the_emulated_engine_ships_only_finished_requests() -> None:
    from testbed.emulator.runtime.wire.messages import PrefillPart
    from testbed.emulator.runtime.worker.compute.engines import EmulatedEngine

    parts = [PrefillPart(1, 100, 0, 40, 800), PrefillPart(2, 50, 0, 50, 400)]
    engine = EmulatedEngine.__new__(EmulatedEngine)
    assert EmulatedEngine.prefill(engine, parts, 0.0) == {2: bytes(400)}


def test_passes_are_batched_up_to_the_option() -> None:
    queue = [Request(i, i * 0.01, 100) for i in range(6)]
    model = PrefillModel({"a": 0.0, "b": 1e-4, "c": 0.0})
    policy = bubble_policy("bubbletea", {"batch": "4", "guard": "0", "guard_s": "0"})
    chunks = policy.admit_batch(Bubble("g", 0.0, 1.0), queue, 0.0, model, 8192)
    assert [c.request.id for c in chunks] == [0, 1, 2, 3]
    assert list(itertools.accumulate(c.tokens for c in chunks))[-1] == 400
