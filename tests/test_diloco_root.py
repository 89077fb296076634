"""Plans that span iterations on real workers over the emulated WAN: with real compute the
DiLoCo family's math equals a one-process reference (tests/diloco_reference.py); with
emulated compute its syncs move the bytes the plan says, and a started sync lets the
stage compute on. Needs root (CI runs as root)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch

from testbed.emulator.runtime.coordinator.coordinator import Coordinator, RunOutcome
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.emulator.runtime.coordinator.signals import run_with_signals
from testbed.emulator.runtime.worker.compute.reference import merge_stages
from testbed.experiments.inputs import load_inputs
from testbed.job.model import Job
from testbed.plan import validate_plan
from testbed.plan.build import Schedule, build_plan
from testbed.plan.collective import Collective, Reduces
from testbed.plan.compute import collective_bytes
from testbed.plan.cycles import cycled
from testbed.plan.host_tcp import hosts_as_planned
from testbed.plan.model import Action, Op, OuterOptimizer, Plan
from testbed.policy import training_policy
from testbed.topology.model import Topology
from tests import diloco_reference as reference
from tests.diloco_reference import Outer, Sync

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("clean_host")]
ROOT = Path(__file__).resolve().parent.parent
TWO_DC = ROOT / "topologies" / "two-dc.yaml"
Tail = Callable[[int], Sequence[Action]]


def _inputs(iterations: int) -> tuple[Topology, Job]:
    inputs = load_inputs(TWO_DC, sets=(f"iterations={iterations}",))
    return inputs.topology, inputs.job


def _replica_per_dc(pp: int) -> dict[tuple[int, int], tuple[str, ...]]:
    """Replica 0's pipeline in east, replica 1's in west."""
    return {(r, s): (f"{dc}-{s}",) for r, dc in enumerate(("east", "west")) for s in range(pp)}


def _at(*actions: tuple[Op, Collective | None]) -> Tail:
    return lambda stage: [Action(stage, op, None, c) for op, c in actions]


NOTHING = _at()


def _plan(topology: Topology, job: Job, pp: int, tails: Sequence[Tail],
          outer: OuterOptimizer | None = None, gradients: Collective | None = None) -> Plan:
    inner = build_plan("test", topology, job, _replica_per_dc(pp), Schedule.ONE_F_ONE_B,
                       gradients=gradients)
    plan = cycled(inner, tails, outer) if tails else inner
    validate_plan(plan, topology)
    return plan


def _run(tmp: Path, topology: Topology, job: Job, plan: Plan, compute: str) -> RunOutcome:
    config = RunConfig(hosts_as_planned(topology, plan), job, plan, training_policy("1f1b"),
                       compute, tmp / "logs", stall_timeout_s=60, save_dir=tmp)  # type: ignore[arg-type]
    outcome = asyncio.run(run_with_signals(Coordinator(config, say=lambda _m: None)))
    assert outcome.status == "ok", outcome.error
    return outcome


def _compare(tmp: Path, plan: Plan, expected: list[dict[str, torch.Tensor]]) -> None:
    """Every replica's parameters, bit for bit: the workers do the reference's fp32
    operations in the same order (a ring of two adds a + b, which is b + a)."""
    for replica, want in enumerate(expected):
        stages = [torch.load(tmp / f"r{replica}-s{s}.pt") for s in range(plan.pp)]
        got = merge_stages(stages, plan.layers)
        assert got.keys() == want.keys()
        for name, value in want.items():
            torch.testing.assert_close(got[name], value, rtol=0, atol=0,
                                       msg=f"{name} of replica {replica}")


def _diverged(expected: list[dict[str, torch.Tensor]]) -> bool:
    return any(not torch.equal(expected[0][k], expected[1][k]) for k in expected[0])


@pytest.mark.parametrize("pp", [1, pytest.param(2, marks=pytest.mark.benchmark)])
def test_diloco_equals_one_process(tmp_path: Path, pp: int) -> None:
    """H = 3 inner steps, then the deltas' all-reduce across the DCs and an outer Nesterov
    step (lr 0.7, momentum 0.9): two outer steps."""
    topology, job = _inputs(iterations=6)
    sync = _at((Op.ALLREDUCE, Collective(Reduces.DELTAS)), (Op.OUTER_STEP, None))
    plan = _plan(topology, job, pp, [NOTHING, NOTHING, sync])
    outcome = _run(tmp_path, topology, job, plan, "real")
    # the synchronized model's loss, evaluated after training: as the cycles start, the
    # replicas' own (the outer step replaced their parameters), and the model at the end
    assert sorted(outcome.synced_losses) == [0, 3, 6]
    for iteration in (0, 3):
        assert outcome.synced_losses[iteration] == pytest.approx(outcome.losses[iteration],
                                                                 rel=1e-6)
    syncs = [Sync("start"), Sync("outer")]
    expected = reference.train(job, 2, plan.microbatches, 6,
                               lambda i: syncs if i % 3 == 2 else [])
    assert not _diverged(expected)  # an outer step with mixing 0 ends the run: one model
    untrained = reference.train(job, 2, plan.microbatches, 6, lambda i: [])
    assert _diverged(untrained)  # without the syncs the replicas would differ
    _compare(tmp_path, plan, expected)


def test_streaming_diloco_equals_one_process(tmp_path: Path) -> None:
    """Two fragments synced in turn, each one inner step after it started (overlap 1),
    the local parameters keeping half their weight (mixing 0.5)."""
    topology, job = _inputs(iterations=8)
    f0, f1 = (Collective(Reduces.DELTAS, k, 2) for k in range(2))
    tails = [_at((Op.ALLREDUCE_START, f0)), _at((Op.ALLREDUCE_WAIT, f0), (Op.OUTER_STEP, f0)),
             _at((Op.ALLREDUCE_START, f1)), _at((Op.ALLREDUCE_WAIT, f1), (Op.OUTER_STEP, f1))]
    mixing = OuterOptimizer(lr=0.7, momentum=0.9, nesterov=True, mixing=0.5)
    plan = _plan(topology, job, 2, tails, mixing)
    _run(tmp_path, topology, job, plan, "real")
    by_phase = [[Sync("start", 0, 2)], [Sync("outer", 0, 2)], [Sync("start", 1, 2)],
                [Sync("outer", 1, 2)]]
    expected = reference.train(job, 2, plan.microbatches, 8, lambda i: by_phase[i % 4],
                               Outer(mixing=0.5))
    _compare(tmp_path, plan, expected)


def test_int8_gradients_with_error_feedback_equal_one_process(tmp_path: Path) -> None:
    topology, job = _inputs(iterations=4)
    plan = _plan(topology, job, 1, [], gradients=Collective(payload="int8"))
    _run(tmp_path, topology, job, plan, "real")
    expected = reference.train(job, 2, plan.microbatches, 4, lambda i: [], gradients="int8")
    _compare(tmp_path, plan, expected)


def _wan_bytes_by_cycle(outcome: RunOutcome, period: int) -> dict[int, int]:
    out: dict[int, int] = {}
    for span in outcome.spans:
        if span["kind"] == "transfer" and span.get("link"):
            cycle = span["iteration"] // period
            out[cycle] = out.get(cycle, 0) + int(span.get("bytes", 0))
    return out


def test_emulated_diloco_moves_each_stages_deltas_across_the_wan_once_a_cycle(
        tmp_path: Path) -> None:
    """A ring of two: each member sends its half in the reduce-scatter and the other
    half in the all-gather, so each stage's deltas cross the WAN once each way per
    cycle; nothing else does (the pipelines stay inside their DCs)."""
    topology, job = _inputs(iterations=6)
    deltas = Collective(Reduces.DELTAS, payload="int8")
    plan = _plan(topology, job, 2, [NOTHING, NOTHING, _at((Op.ALLREDUCE, deltas),
                                                           (Op.OUTER_STEP, None))])
    outcome = _run(tmp_path, topology, job, plan, "emulated")
    per_stage = [collective_bytes(job, plan.layers, s, deltas) for s in range(plan.pp)]
    assert _wan_bytes_by_cycle(outcome, 3) == {0: 2 * sum(per_stage), 1: 2 * sum(per_stage)}
    rings = [s for s in outcome.spans if s["kind"] == "allreduce"]
    assert sorted((s["iteration"], s["stage"], s["bytes"], s["collective"]) for s in rings) == \
        sorted((i, s, per_stage[s], "delta,int8") for i in (2, 5) for s in range(2)
               for _ in range(2))


def test_a_started_sync_lets_the_stage_compute_while_its_ring_crosses_the_wan(
        tmp_path: Path) -> None:
    """Streaming DiLoCo's overlap: the ring started after iteration 0's step is awaited
    after iteration 1's; iteration 1's compute runs while it is on the WAN (int4 deltas
    are gathered, not summed around a ring: across a 20 ms link two members' gather takes
    at least one one-way trip, a ring two; an emulated tiny forward, microseconds)."""
    topology, job = _inputs(iterations=4)
    c = Collective(Reduces.DELTAS, 0, 1, "int4")
    plan = _plan(topology, job, 2, [_at((Op.ALLREDUCE_START, c)),
                                    _at((Op.ALLREDUCE_WAIT, c), (Op.OUTER_STEP, None))])
    outcome = _run(tmp_path, topology, job, plan, "emulated")
    per_stage = [collective_bytes(job, plan.layers, s, c) for s in range(plan.pp)]
    assert _wan_bytes_by_cycle(outcome, 2) == {0: 2 * sum(per_stage), 1: 2 * sum(per_stage)}
    trips = 1 if c.gathers else 2
    for gpu in plan.used_gpus():
        mine = [s for s in outcome.spans if s["gpu"] == gpu]
        rings = [s for s in mine if s["kind"] == "allreduce"]
        assert [s["iteration"] for s in rings] == [0, 2]
        for ring in rings:
            assert ring["end"] - ring["start"] > trips * 0.0195  # one-way trips of 20 ms
            during = [s for s in mine if s["kind"] in ("forward", "backward")
                      and s["iteration"] == ring["iteration"] + 1
                      and ring["start"] <= s["start"] and s["end"] <= ring["end"]]
            assert during, (gpu, ring)
        outer = [s for s in mine if s["kind"] == "outer_step" and s.get("collective") == "delta"]
        assert [s["iteration"] for s in outer] == [1, 3]
