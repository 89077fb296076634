"""The simulator on plans that span iterations: DiLoCo's rare syncs, fragments synced in
turn, compressed payloads, syncs overlapped with compute, reduces inside a DC; and what
reads a plan per iteration (bubble predictions, memory, the summary) on such plans."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from testbed.common.spans import Span
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.inference.bubbles import make_broker
from testbed.inference.memory import in_flight_of
from testbed.inference.workload import predicted_bubbles
from testbed.job.model import Job, ModelShape
from testbed.metrics.summary import counted_iterations
from testbed.plan import validate_plan
from testbed.plan.build import Schedule, build_plan
from testbed.plan.collective import Collective, Reduces, Scope, payload_bytes
from testbed.plan.compute import collective_bytes, ring_allreduce_s
from testbed.plan.cycles import cycled
from testbed.plan.model import Action, Op, Plan
from testbed.plan.throughput import tokens_per_iteration
from testbed.policy import training_policy
from testbed.report.results import RunRecord
from testbed.report.table import run_summary
from testbed.sim.bubble_seed import modeled_waits
from testbed.sim.simulate import simulate_plan, simulated_iteration_s
from testbed.sim.simulator import Simulator
from testbed.topology import Topology

ROOT = Path(__file__).resolve().parent.parent
PAPER = load_inputs(ROOT / "topologies" / "paper-3dc.yaml")
DP = training_policy("dp-across-dc", {"bucket_mb": "0"})
"""Every-step data parallelism, each stage's gradient in one all-reduce; also the arbiter
of the plans built here: they share every link fairly."""
DELTAS = Collective(Reduces.DELTAS)
Tail = Callable[[int], Sequence[Action]]


def _at(*actions: tuple[Op, Collective | None]) -> Tail:
    return lambda stage: [Action(stage, op, None, c) for op, c in actions]


NOTHING = _at()


def _sync(c: Collective = DELTAS) -> Tail:
    return _at((Op.ALLREDUCE, c), (Op.OUTER_STEP, replace(c, payload="")))


def _every_step(iterations: int) -> Plan:
    """dp-across-dc on paper-3dc: one whole pipeline of 4 stages per DC, gradients
    all-reduced across the DCs every step."""
    job = replace(PAPER.job, iterations=iterations)
    return plan_with_simulator(DP, PAPER.topology, job)


def _diloco(tails: Sequence[Tail]) -> Plan:
    """dp-across-dc's placement, replicas stepping apart, synced as `tails` say."""
    inner = build_plan("diloco", PAPER.topology, PAPER.job, _every_step(1).placement,
                       Schedule.ONE_F_ONE_B, gradients=None)
    plan = cycled(inner, tails)
    validate_plan(plan, PAPER.topology)
    return plan


def _simulate(plan: Plan, iterations: int, topology: Topology = PAPER.topology,
              job: Job = PAPER.job, profile: Any = None) -> tuple[Any, list[Span]]:
    return simulate_plan(topology, replace(job, iterations=iterations), plan, DP, profile)


def _wan_per_iteration(spans: list[Span], iterations: int) -> list[int]:
    out = [0] * iterations
    for span in spans:
        if span["kind"] == "transfer" and span.get("link"):
            out[span["iteration"]] += span["bytes"]
    return out


def _ring_bytes(plan: Plan, c: Collective) -> int:
    """WAN bytes of one all-reduce of `c` on every stage, one replica per DC: a dense
    ring's 2(n-1) steps of 1/n of each member's bytes (rounded down) on each of n hops, a
    gathered one's n-1 steps of a member's bytes."""
    n = plan.dp
    if c.gathers:
        return sum((n - 1) * n * collective_bytes(PAPER.job, plan.layers, s, c)
                   for s in range(plan.pp))
    return sum(2 * (n - 1) * n * (collective_bytes(PAPER.job, plan.layers, s, c) // n)
               for s in range(plan.pp))


def test_diloco_moves_every_step_dp_s_wan_bytes_divided_by_h_and_its_sync_is_longer() -> None:
    h = 10
    _, every_spans = _simulate(_every_step(2), 2)
    per_step = _wan_per_iteration(every_spans, 2)
    assert per_step[0] == per_step[1] == _ring_bytes(_every_step(2), Collective()) > 0
    plan = _diloco([NOTHING] * (h - 1) + [_sync()])
    summary, spans = _simulate(plan, h)
    wan = _wan_per_iteration(spans, h)
    assert sum(wan) / h == pytest.approx(per_step[1] / h, rel=0.05)
    assert wan[:-1] == [0] * (h - 1)  # whole pipelines in a DC: only the sync crosses
    times = summary.iteration_times
    assert times[-1] > max(times[:-1])
    syncs = [s for s in spans if s["kind"] == "allreduce"]
    assert {s["iteration"] for s in syncs} == {h - 1}
    assert {s["collective"] for s in syncs} == {"delta"}
    # the sync's iteration lasts at least its all-reduce more than the plain ones
    assert times[-1] >= statistics.median(times[1:-1]) + min(s["end"] - s["start"]
                                                            for s in syncs)


def test_fragments_in_turn_move_one_whole_sync_s_bytes_at_a_fraction_of_its_peak() -> None:
    n = 4

    def fragment(k: int) -> Tail:
        return _sync(Collective(Reduces.DELTAS, k, n))

    whole_plan = _diloco([NOTHING] * (n - 1) + [_sync()])
    streamed = _diloco([fragment(k) for k in range(n)])
    _, whole_spans = _simulate(whole_plan, n)
    _, streamed_spans = _simulate(streamed, n)
    whole = _wan_per_iteration(whole_spans, n)
    parts = _wan_per_iteration(streamed_spans, n)
    assert whole[-1] == _ring_bytes(whole_plan, DELTAS)
    assert parts == [_ring_bytes(streamed, Collective(Reduces.DELTAS, k, n)) for k in range(n)]
    # the same bytes but for each ring's rounding to 1/n of a member's bytes
    assert sum(parts) == pytest.approx(sum(whole), rel=1e-8)
    # ~n-fold lower peak: fragments are whole blocks, the embedding and output layer
    # ride with the first and last block's fragment, so they are not exactly equal
    assert max(whole) / max(parts) == pytest.approx(n, rel=0.1)


@pytest.mark.parametrize("payload", ["int4", "int8", "fp4"])
def test_a_quantized_sync_moves_its_payload_s_bytes(payload: str) -> None:
    """Quantized once and gathered: each member's payload crosses n - 1 hops, where a
    ring of bf16 moves 2(n - 1)/n of a member's bytes on each of n hops."""
    bf16 = _diloco([NOTHING, _sync(Collective(Reduces.DELTAS, payload="bf16"))])
    quantized = _diloco([NOTHING, _sync(Collective(Reduces.DELTAS, payload=payload))])
    dense = sum(_wan_per_iteration(_simulate(bf16, 2)[1], 2))
    small = sum(_wan_per_iteration(_simulate(quantized, 2)[1], 2))
    assert small == _ring_bytes(quantized, Collective(Reduces.DELTAS, payload=payload))
    bits = {"int4": 4, "int8": 8, "fp4": 4}[payload]
    n = bf16.dp
    gathered = n / 2  # n - 1 payloads against 2(n - 1)/n
    # bits/16 of bf16's, plus a 4-byte scale per 256 elements
    assert small / dense == pytest.approx(gathered * (bits / 16 + 4 / 256 / 2), rel=1e-4)


def test_a_top_k_sync_gathers_every_member_s_pairs() -> None:
    c = Collective(Reduces.DELTAS, payload="top1%")
    plan = _diloco([NOTHING, _sync(c)])
    summary, spans = _simulate(plan, 2)
    n = plan.dp
    # ring all-gather: n-1 steps, each member forwarding one member's (index, value) pairs
    expected = sum(n * (n - 1) * collective_bytes(PAPER.job, plan.layers, s, c)
                   for s in range(plan.pp))
    params = [collective_bytes(PAPER.job, plan.layers, s, Collective(payload="fp32")) // 4
              for s in range(plan.pp)]
    assert expected == sum(n * (n - 1) * payload_bytes(p, "top1%", 2) for p in params)
    assert sum(_wan_per_iteration(spans, 2)) == expected == summary.wan_bytes


def _small() -> tuple[Job, dict[tuple[int, int], tuple[str, ...]], dict[int, dict[str, float]]]:
    """A model whose sync takes less than two iterations' compute: two stages per DC."""
    model = ModelShape(layers=8, hidden=1024, heads=8, seq_len=256, vocab=1024)
    placement = {(r, s): (dc.host_names()[s],)
                 for r, dc in enumerate(PAPER.topology.datacenters) for s in range(2)}
    profile = {s: {"forward_s": 0.5, "backward_s": 1.0} for s in range(2)}
    return Job(model=model, microbatches=4), placement, profile


def test_a_sync_overlapped_with_compute_costs_the_cycle_nothing_a_blocking_one_costs_it_all(
        ) -> None:
    job, placement, profile = _small()
    inner = build_plan("t", PAPER.topology, job, placement, Schedule.ONE_F_ONE_B,
                       gradients=None)
    start, wait = _at((Op.ALLREDUCE_START, DELTAS)), _at((Op.ALLREDUCE_WAIT, DELTAS),
                                                         (Op.OUTER_STEP, None))
    overlapped = cycled(inner, [NOTHING, start, NOTHING, wait])  # tau = 2 iterations
    blocking = cycled(inner, [NOTHING, NOTHING, NOTHING, _sync()])
    for plan in (overlapped, blocking):
        validate_plan(plan, PAPER.topology)
    # no sync at all: not a valid plan (replicas diverge), but what compute alone takes
    alone, _ = _simulate(inner, 8, job=job, profile=profile)
    hidden, hidden_spans = _simulate(overlapped, 8, job=job, profile=profile)
    paid, paid_spans = _simulate(blocking, 8, job=job, profile=profile)
    plain = 4 * alone.mean_s
    waits = [s for s in hidden_spans if s["kind"] == "wait_reduce"]
    assert len(waits) == 2 * len(overlapped.placement)  # every GPU, every cycle
    # the sync ran shorter than the two iterations it overlapped: no one waited for it
    assert all(s["end"] == s["start"] for s in waits)
    syncs = [s for s in hidden_spans if s["kind"] == "allreduce"]
    assert {s["iteration"] for s in syncs} == {1, 5} and all("action" not in s for s in syncs)
    # its bytes share only the NICs with the pipeline (100 Gbit/s against the WAN's 1):
    # the pipeline's transfers lose at most 1% of their rate
    assert hidden.cycle_s == pytest.approx(plain, rel=0.01)
    blocked = min(s["end"] - s["start"] for s in paid_spans if s["kind"] == "allreduce")
    assert paid.cycle_s >= plain + blocked * (1 - 1e-9)
    assert hidden.cycle_s < paid.cycle_s


def test_a_dc_scoped_reduce_takes_the_closed_form_and_never_crosses_the_wan() -> None:
    job, _, profile = _small()
    placement = {}
    for dc_index, dc in enumerate(PAPER.topology.datacenters):  # 2 replicas per DC
        hosts = dc.host_names()
        for local in range(2):
            for stage in range(2):
                placement[(2 * dc_index + local, stage)] = (hosts[2 * local + stage],)
    local_grads = Collective(scope=Scope.DC)
    inner = build_plan("t", PAPER.topology, job, placement, Schedule.ONE_F_ONE_B,
                       gradients=local_grads)
    plan = cycled(inner, [NOTHING, _sync()])
    validate_plan(plan, PAPER.topology)
    summary, spans = _simulate(plan, 4, job=job, profile=profile)
    wan = _wan_per_iteration(spans, 4)
    assert wan[0] == wan[2] == 0 and wan[1] == wan[3] > 0
    local = [s for s in spans if s["kind"] == "allreduce" and s["collective"] == "dc"]
    assert len(local) == 4 * len(plan.placement)
    groups: dict[tuple[int, int, str], list[Span]] = {}
    for span in local:
        groups.setdefault((span["iteration"], span["stage"], span["gpu"].split("-")[0]),
                          []).append(span)
    dc = PAPER.topology.datacenters[0]
    for (_, stage, _), members in groups.items():
        assert len(members) == 2
        nbytes = collective_bytes(job, plan.layers, stage, local_grads)
        last_join = max(s["start"] for s in members)
        for span in members:  # done a ring's closed form after the last member joined
            assert span["end"] - last_join == pytest.approx(
                ring_allreduce_s(nbytes, 2, dc.bandwidth_bps, dc.latency_s), rel=1e-9)
            assert span["bytes"] == nbytes
    assert summary.wan_bytes == sum(wan)


def test_a_cycle_is_judged_over_whole_cycles_and_never_stopped_early() -> None:
    h = 4
    plan = _diloco([NOTHING] * (h - 1) + [_sync()])
    job = replace(PAPER.job, iterations=2 * h + 1)  # ends one iteration into a cycle
    summary, _ = simulate_plan(PAPER.topology, job, plan, DP)
    times = summary.iteration_times
    kept = times[1:]  # after the first iteration, the two whole cycles
    assert list(counted_iterations(len(times), h)) == list(range(1, 2 * h + 1))
    assert summary.cycles == 2 and summary.period == h
    assert summary.mean_s == pytest.approx(statistics.fmean(kept))
    assert summary.cycle_s == pytest.approx(sum(kept) / 2)
    assert summary.tokens_per_s == pytest.approx(
        tokens_per_iteration(job, plan) * h / summary.cycle_s)
    # the median is a plain iteration's: nothing a cycle's throughput follows
    assert summary.median_s is not None and summary.median_s < summary.mean_s / 2
    results = summary.as_results()
    assert results["cycle_time_s"] == {"mean": summary.cycle_s, "period": h, "cycles": 2}
    assert results["iteration_time_s"]["mean"] == summary.mean_s
    # a planner asking with a bound far below it still gets the mean over whole cycles
    assert simulated_iteration_s(PAPER.topology, job, plan, DP, stop_above=1e-3) == \
        pytest.approx(summary.mean_s)


def test_a_run_s_summary_says_what_its_cycle_takes() -> None:
    plan = _diloco([NOTHING, _sync()])
    job = replace(PAPER.job, iterations=5)
    summary, spans = simulate_plan(PAPER.topology, job, plan, DP)
    record = RunRecord("simulate", "diloco", None, PAPER.topology, job, plan, None, "modeled",
                       summary, spans, 0.0)
    lines = run_summary(record.typed())
    assert f"  cycle         2 iterations, mean {summary.cycle_s:.3f} s over 2 whole cycles" \
        in lines
    assert record.results()["plan"]["period"] == 2


def test_a_run_shorter_than_its_cycle_has_no_throughput_to_report() -> None:
    plan = _diloco([NOTHING] * 3 + [_sync()])
    summary, _ = _simulate(plan, 3)
    assert summary.cycles == 0 and summary.tokens_per_s is None and summary.cycle_s is None
    assert len(summary.iteration_times) == 3


def test_bubbles_are_predicted_per_program() -> None:
    plan = _diloco([NOTHING, _sync()])
    broker = make_broker(PAPER.topology, PAPER.job, plan, "bubbletea")
    assert broker is not None
    gpu, index = plan.lead_gpu(0, 0), len(plan.actions[plan.lead_gpu(0, 0)])
    broker.record_wait(gpu, 3, 1, 5.0)  # iteration 1 runs program 1 (the sync)
    assert broker.predicted(gpu, 3, 1) == 5.0 and broker.predicted(gpu, 3) is None
    broker.record_wait(gpu, 3, 2, 0.5)  # iteration 2 runs program 0 again
    assert broker.predicted(gpu, 3) == 0.5 and broker.predicted(gpu, 3, 1) == 5.0
    spans = [{"kind": "allreduce", "gpu": gpu, "action": index, "iteration": i,
              "start": 0.0, "end": 9.0} for i in (1, 3)]
    assert predicted_bubbles(spans, program_of=plan.program_of) == {(gpu, index, 1): 9.0}


def test_bubbletea_fills_the_sync_s_wait_without_slowing_a_cycle() -> None:
    plan = _diloco([NOTHING, _sync()])
    job = replace(PAPER.job, iterations=4)
    seed = modeled_waits(PAPER.topology, job, plan, DP)
    sync_at = len(plan.programs[0][plan.lead_gpu(0, 0)]) - 2
    assert seed[(plan.lead_gpu(0, 0), sync_at, 1)] > 10  # the sync: minutes on the WAN
    broker = make_broker(PAPER.topology, job, plan, "bubbletea", None, seed)
    alone, _ = simulate_plan(PAPER.topology, job, plan, DP)
    filled, spans = simulate_plan(PAPER.topology, job, plan, DP, broker=broker)
    assert filled.iteration_times == pytest.approx(alone.iteration_times, rel=1e-9)
    in_sync = [s for s in spans if s["kind"] == "prefill" and s["iteration"] % 2 == 1
               and any(w["kind"] == "allreduce" and w["gpu"] == s["gpu"]
                       and w["start"] <= s["start"] < w["end"] for w in spans)]
    assert in_sync


def test_memory_counts_the_program_that_holds_most_activations() -> None:
    one_f_one_b = _diloco([NOTHING, _sync()])
    gpipe = build_plan("g", PAPER.topology, PAPER.job, one_f_one_b.placement,
                       Schedule.GPIPE, gradients=None)
    mixed = replace(one_f_one_b, programs=(gpipe.actions,))
    gpu = mixed.lead_gpu(0, 0)
    assert in_flight_of(one_f_one_b, gpu) < in_flight_of(mixed, gpu) == mixed.microbatches


@pytest.mark.timeout(60)
def test_a_step_the_simulator_does_not_know_ends_the_run_with_its_name() -> None:
    job, placement, _ = _small()
    plan = build_plan("t", PAPER.topology, job, placement, Schedule.ONE_F_ONE_B)
    simulator = Simulator(PAPER.topology, replace(job, iterations=1), plan, DP)
    worker = next(iter(simulator.workers.values()))
    worker.programs = ((object(),),)  # type: ignore[assignment]
    worker.begin(0)
    with pytest.raises(RuntimeError, match="the simulator cannot run <object object"):
        simulator.run()



def test_int8_gradients_and_int8_deltas_are_both_gathered() -> None:
    """Each member's compressed gradient crosses n-1 links whole (error feedback is exact
    only so); quantized deltas too (Streaming DiLoCo sums its 4-bit outer gradients in
    fp32), where bf16 ones go round the ring, 2(n-1)/n of theirs."""
    grads, deltas = Collective(payload="int8"), Collective(Reduces.DELTAS, payload="int8")
    every_step = build_plan("dp-compressed", PAPER.topology, PAPER.job,
                            _every_step(1).placement, Schedule.ONE_F_ONE_B, gradients=grads)
    _, spans = _simulate(every_step, 2)
    n = every_step.dp
    gathered = sum(n * (n - 1) * collective_bytes(PAPER.job, every_step.layers, s, grads)
                   for s in range(every_step.pp))
    assert _wan_per_iteration(spans, 2) == [gathered, gathered] and n == 3
    synced = _diloco([_sync(deltas)])
    _, spans = _simulate(synced, 2)
    assert _wan_per_iteration(spans, 2) == [_ring_bytes(synced, deltas)] * 2 == [gathered] * 2
