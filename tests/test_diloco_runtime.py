"""The DiLoCo family and compressed data parallelism in real compute, without namespaces:
stage runners of whole plans over real transports on localhost, each stage its own torch
module, optimizer and syncs, end with every parameter bit for bit as the one-process
reference (tests/diloco_reference.py) has it. (The same over the emulated WAN, as root:
tests/test_diloco_root.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from testbed.emulator.runtime.coordinator.pool import WorkerHandle
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.emulator.runtime.coordinator.worker_setup import worker_config
from testbed.emulator.runtime.worker.compute.model import (
    build_model,
    loss_of,
    make_corpus,
    sample_index,
)
from testbed.emulator.runtime.worker.compute.real_engine import RealEngine
from testbed.emulator.runtime.worker.compute.reference import merge_stages
from testbed.emulator.runtime.worker.stage_runner import StageRunner
from testbed.emulator.runtime.worker.synced_loss import synced_losses
from testbed.experiments.inputs import load_inputs
from testbed.job.model import Job
from testbed.plan import validate_plan
from testbed.plan.build import Schedule, build_plan
from testbed.plan.collective import Collective, Reduces
from testbed.plan.cycles import cycled
from testbed.plan.model import Action, Op, OuterOptimizer, Plan
from testbed.policy import training_policy
from testbed.topology.model import Topology
from tests import diloco_reference as reference
from tests.diloco_reference import Outer, Sync
from tests.test_stage_runner import _run_configs

TWO_DC = Path(__file__).resolve().parent.parent / "topologies" / "two-dc.yaml"
Tail = Callable[[int], Sequence[Action]]


def _inputs(iterations: int) -> tuple[Topology, Job]:
    inputs = load_inputs(TWO_DC, sets=(f"iterations={iterations}",))
    return inputs.topology, inputs.job


def _at(*actions: tuple[Op, Collective | None]) -> Tail:
    return lambda stage: [Action(stage, op, None, c) for op, c in actions]


NOTHING = _at()


def _plan(topology: Topology, job: Job, pp: int, tails: Sequence[Tail],
          outer: OuterOptimizer | None = None, gradients: Collective | None = None) -> Plan:
    """Replica 0's pipeline in east, replica 1's in west."""
    placement = {(r, s): (f"{dc}-{s}",) for r, dc in enumerate(("east", "west"))
                 for s in range(pp)}
    inner = build_plan("test", topology, job, placement, Schedule.ONE_F_ONE_B,
                       gradients=gradients)
    plan = cycled(inner, tails, outer) if tails else inner
    validate_plan(plan, topology)
    return plan


def _train(topology: Topology, job: Job, plan: Plan,
           losses: dict[int, list[float]] | None = None,
           synced: dict[int, float] | None = None,
           told: list[dict[str, Any]] | None = None) -> list[StageRunner]:
    """The plan's workers, trained; `losses`: each iteration's as the runners report them;
    `synced`: the synchronized model's, as the workers evaluate it after training; `told`:
    every message they sent the coordinator's stand-in."""
    run = RunConfig(topology, job, plan, training_policy("1f1b"), "real", Path("logs"))
    workers = [WorkerHandle(n, gpu, *plan.worker_of(gpu), plan.stages_of(gpu))
               for n, gpu in enumerate(plan.used_gpus())]
    configs = [worker_config(run, w, workers, lambda _gpu: "127.0.0.1", ()) for w in workers]

    async def evaluate(runners: list[StageRunner]) -> None:
        found = await asyncio.gather(*(synced_losses(r) for r in runners))
        if synced is not None:
            for losses_of in found:
                synced.update(losses_of)

    runners, controls = asyncio.run(_run_configs(configs, job.iterations, losses, evaluate))
    if told is not None:
        told.extend(m for control in controls for m in control.messages)
    return runners


def _compare(runners: list[StageRunner], plan: Plan,
             expected: list[dict[str, torch.Tensor]]) -> None:
    """Every replica's parameters, bit for bit."""
    for replica, want in enumerate(expected):
        held = {stage: engine.module.state_dict() for runner in runners
                if runner.config.replica == replica
                for stage, engine in runner.engines.items()
                if isinstance(engine, RealEngine)}
        got = merge_stages([held[s] for s in range(plan.pp)], plan.layers)
        assert got.keys() == want.keys()
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=0, atol=0,
                                       msg=f"{name} of replica {replica}")


@pytest.mark.parametrize("payload", ["int8", "int4", "top10%"])
def test_compressed_gradients_with_error_feedback_equal_one_process(payload: str) -> None:
    """Every step, each replica's gradient plus its residual compressed once and
    gathered (EF-SGD), as the reference writes it from the paper."""
    topology, job = _inputs(iterations=4)
    plan = _plan(topology, job, 1, [], gradients=Collective(payload=payload))
    runners = _train(topology, job, plan)
    expected = reference.train(job, 2, plan.microbatches, 4, lambda i: [],
                               gradients=payload)
    _compare(runners, plan, expected)


@pytest.mark.parametrize(("payload", "pp"), [("", 2), ("int4", 1)])
def test_diloco_equals_one_process(payload: str, pp: int) -> None:
    """H = 3 inner steps of AdamW, then the deltas' ring all-reduce across the DCs (int4:
    requantized at every hop; the reference's ring chunks a whole replica's deltas, as one
    stage does) and an outer Nesterov step: two outer steps."""
    topology, job = _inputs(iterations=6)
    deltas = Collective(Reduces.DELTAS, payload=payload)
    plan = _plan(topology, job, pp, [NOTHING, NOTHING,
                                    _at((Op.ALLREDUCE, deltas), (Op.OUTER_STEP, None))])
    runners = _train(topology, job, plan)
    syncs = [Sync("start", payload=payload), Sync("outer")]
    expected = reference.train(job, 2, plan.microbatches, 6,
                               lambda i: syncs if i % 3 == 2 else [])
    _compare(runners, plan, expected)


def test_streaming_diloco_equals_one_process() -> None:
    """Two fragments synced in turn, each one inner step after it started (overlap 1),
    the local parameters keeping half their weight (mixing 0.5)."""
    topology, job = _inputs(iterations=8)
    f0, f1 = (Collective(Reduces.DELTAS, k, 2) for k in range(2))
    tails = [_at((Op.ALLREDUCE_START, f0)), _at((Op.ALLREDUCE_WAIT, f0), (Op.OUTER_STEP, f0)),
             _at((Op.ALLREDUCE_START, f1)), _at((Op.ALLREDUCE_WAIT, f1), (Op.OUTER_STEP, f1))]
    plan = _plan(topology, job, 2, tails, OuterOptimizer(mixing=0.5))
    runners = _train(topology, job, plan)
    by_phase = [[Sync("start", 0, 2)], [Sync("outer", 0, 2)], [Sync("start", 1, 2)],
                [Sync("outer", 1, 2)]]
    expected = reference.train(job, 2, plan.microbatches, 8, lambda i: by_phase[i % 4],
                               Outer(mixing=0.5))
    _compare(runners, plan, expected)


def _synced_loss(job: Job, microbatches: int, iteration: int,
                 outer: dict[str, torch.Tensor]) -> float:
    """The model of parameters `outer`, whole, on iteration `iteration`'s global batch of
    two replicas: its mean loss."""
    model = build_model(job.model, job.seed)
    model.load_state_dict(outer)
    corpus = make_corpus(job.model, job.seed, job.data)
    losses = []
    with torch.no_grad():
        for replica in range(2):
            for microbatch in range(microbatches):
                first = sample_index(iteration, replica, microbatch, 2, microbatches,
                                     job.microbatch_size)
                inputs, targets = corpus.batch(first, job.microbatch_size)
                losses.append(float(loss_of(model(inputs), targets)))
    return sum(losses) / len(losses)


def test_plain_diloco_s_synchronized_loss_is_its_replicas_loss_as_a_cycle_starts() -> None:
    """The outer step replaces the local parameters: the loss the replicas report as each
    cycle starts is the synchronized model's, which the workers evaluate after training
    (at the start and after each cycle but the last), over the pipeline of replica 0."""
    topology, job = _inputs(iterations=9)
    plan = _plan(topology, job, 2, [NOTHING, NOTHING, _at(
        (Op.ALLREDUCE, Collective(Reduces.DELTAS)), (Op.OUTER_STEP, None))])
    losses: dict[int, list[float]] = {}
    synced: dict[int, float] = {}
    _train(topology, job, plan, losses, synced)
    assert sorted(synced) == [0, 3, 6, 9]  # 9: the model the run ends with
    for iteration in (0, 3, 6):
        reported = sum(losses[iteration]) / len(losses[iteration])
        assert synced[iteration] == pytest.approx(reported, rel=1e-6), iteration


def test_streaming_diloco_s_synchronized_loss_is_the_outer_model_s() -> None:
    """With fragments and mixing the local models never equal the synchronized one: its
    loss is the outer parameters' (as the reference keeps them) on the iteration's batch,
    not what the replicas report."""
    topology, job = _inputs(iterations=8)
    f0, f1 = (Collective(Reduces.DELTAS, k, 2) for k in range(2))
    tails = [_at((Op.ALLREDUCE_START, f0)), _at((Op.ALLREDUCE_WAIT, f0), (Op.OUTER_STEP, f0)),
             _at((Op.ALLREDUCE_START, f1)), _at((Op.ALLREDUCE_WAIT, f1), (Op.OUTER_STEP, f1))]
    plan = _plan(topology, job, 2, tails, OuterOptimizer(mixing=0.5))
    losses: dict[int, list[float]] = {}
    synced: dict[int, float] = {}
    _train(topology, job, plan, losses, synced)
    kept: dict[int, dict[str, torch.Tensor]] = {0: {}, 4: {}, 8: {}}
    by_phase = [[Sync("start", 0, 2)], [Sync("outer", 0, 2)], [Sync("start", 1, 2)],
                [Sync("outer", 1, 2)]]
    reference.train(job, 2, plan.microbatches, 8, lambda i: by_phase[i % 4],
                    Outer(mixing=0.5), kept=kept)
    assert sorted(synced) == [0, 4, 8]
    for iteration, outer in kept.items():
        expected = _synced_loss(job, plan.microbatches, iteration, outer)
        assert synced[iteration] == pytest.approx(expected, rel=1e-5), iteration
    assert synced[4] != pytest.approx(sum(losses[4]) / 2, rel=1e-3)


def _policy(policy: str, iterations: int, **options: str) -> tuple[Topology, Job, Plan]:
    """A policy's own plan on two-dc, one whole replica per DC, one stage each."""
    inputs = load_inputs(TWO_DC, sets=(f"iterations={iterations}", "dc.gpus=1", "pp=1"))
    chosen = training_policy(policy, dict(options))
    plan = chosen.plan(inputs.topology, inputs.job, None)  # type: ignore[arg-type]
    validate_plan(plan, inputs.topology)
    return inputs.topology, inputs.job, plan


def _buckets(plan: Plan) -> int:
    found = {a.subject.buckets for program in plan.all_programs()
             for actions in program.values() for a in actions
             if a.op.is_collective and a.op is not Op.OUTER_STEP}
    assert len(found) == 1, found
    return found.pop()


@pytest.mark.parametrize(("payload", "order"), [("", "fair"), ("int8", "fair"),
                                                ("", "first-layers")])
def test_data_parallel_gradients_in_buckets_equal_one_process(payload: str, order: str) -> None:
    """Torch DDP's way: each bucket of the gradient, in the order the backward produces
    it, starts its own all-reduce as the backward has it; the step waits for all. Ordered
    syncs ask the arbiter for the WAN before each of their transfers, naming the bucket."""
    policy = "dp-across-dc" if not payload else "dp-compressed"
    options = {"bucket_mb": "0.1", "sync_order": order,
               **({"payload": payload} if payload else {})}
    topology, job, plan = _policy(policy, 3, **options)
    buckets = _buckets(plan)
    assert buckets > 2
    told: list[dict[str, Any]] = []
    runners = _train(topology, job, plan, told=told)
    asked = {m["collective"] for m in told if m["op"] == "request"}
    assert asked == (set() if order == "fair" else {f"b{k}/{buckets}" for k in range(buckets)})
    expected = reference.train(job, 2, plan.microbatches, 3, lambda i: [],
                               gradients=payload or "fp32", gradient_buckets=buckets)
    _compare(runners, plan, expected)


@pytest.mark.parametrize("payload", ["bf16", "fp4"])
def test_diloco_deltas_in_buckets_started_in_the_backward_equal_one_process(
        payload: str) -> None:
    """Every bucket's parameters take their inner step in the backward of the sync's
    step (optimizer in the backward) and their deltas start there: the same values as a
    step after it; fp4 (the Streaming DiLoCo paper's E3M0) quantized once, summed in fp32."""
    bits = {"bf16": "16", "fp4": "4"}[payload]
    topology, job, plan = _policy("diloco", 6, inner_steps="3", outer_bits=bits,
                                  bucket_mb="0.1")
    buckets = _buckets(plan)
    assert buckets > 2
    runners = _train(topology, job, plan)
    syncs = [Sync("start", payload=payload, buckets=buckets), Sync("outer", buckets=buckets)]
    expected = reference.train(job, 2, plan.microbatches, 6,
                               lambda i: syncs if i % 3 == 2 else [])
    _compare(runners, plan, expected)


@pytest.mark.parametrize("buckets", ["0", "0.1"])
def test_eager_diloco_equals_one_process(buckets: str) -> None:
    """Kale, Douillard and Donchev's eager updates: each sync overlaps the next H steps,
    each outer step takes (own fresh + others' previous) / M at once; three outer steps,
    the first with nothing before it."""
    topology, job, plan = _policy("diloco", 9, inner_steps="3", eager="on", bucket_mb=buckets)
    n = _buckets(plan)
    runners = _train(topology, job, plan)
    syncs = [Sync("start", payload="bf16", buckets=n), Sync("outer", buckets=n)]
    expected = reference.train(job, 2, plan.microbatches, 9,
                               lambda i: syncs if i % 3 == 2 else [], Outer(eager=True))
    _compare(runners, plan, expected)


def test_eager_streaming_diloco_with_fp4_equals_one_process() -> None:
    """Two fragments in turn, each sync overlapping a whole outer step, 4-bit floats."""
    topology, job, plan = _policy("streaming-diloco", 8, inner_steps="4", fragments="2",
                                  eager="on", outer_bits="4", bucket_mb="0")
    runners = _train(topology, job, plan)
    by_phase: list[list[Sync]] = [[], [Sync("start", 0, 2, "fp4"), Sync("outer", 0, 2)], [],
                                  [Sync("start", 1, 2, "fp4"), Sync("outer", 1, 2)]]
    expected = reference.train(job, 2, plan.microbatches, 8, lambda i: by_phase[i % 4],
                               Outer(eager=True))
    _compare(runners, plan, expected)


def test_streaming_diloco_whose_syncs_cross_the_cycle_s_end_equals_one_process() -> None:
    """Overlap 3 of H = 4 with two fragments starting after steps 1 and 3: both land in
    the next cycle, at its steps 0 and 2 (the run's first cycle lands none)."""
    topology, job, plan = _policy("streaming-diloco", 8, inner_steps="4", fragments="2",
                                  overlap="3", bucket_mb="0", outer_bits="32")
    assert plan.opening
    runners = _train(topology, job, plan)

    def schedule(i: int) -> list[Sync]:
        phase = i % 4
        if phase in (1, 3):
            return [Sync("start", phase // 2, 2, "fp32")]
        return [Sync("outer", phase // 2, 2)] if i >= 4 else []

    expected = reference.train(job, 2, plan.microbatches, 8, schedule, Outer(mixing=0.5))
    _compare(runners, plan, expected)
