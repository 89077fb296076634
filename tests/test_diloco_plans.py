"""The DiLoCo family's plans: what syncs when, and the options' errors. (What the syncs
move and cost is measured in the simulator's tests.)"""

from __future__ import annotations

import math
import warnings

import pytest

from testbed import api, errors
from testbed.errors import InputError
from testbed.plan import Op, interpret, validate_plan
from testbed.plan.collective import Collective, Reduces, Scope
from tests.conftest import TOPOLOGIES

PAPER = TOPOLOGIES / "paper-3dc.yaml"


def _syncs(plan: api.Plan, stage: int = 0) -> list[tuple[int, str]]:
    gpu = plan.lead_gpu(0, stage)
    return [(i, str(a)) for i in range(plan.period) for a in plan.steady_actions_at(i)[gpu]
            if a.op.is_collective]


def test_diloco_syncs_every_h_steps_with_an_outer_step() -> None:
    inputs = api.load(PAPER)
    plan = api.plan(inputs, "diloco", {"inner_steps": "10", "bucket_mb": "0"})
    validate_plan(plan, inputs.topology)
    assert plan.period == 10 and (plan.outer.lr, plan.outer.momentum) == (0.7, 0.9)
    assert _syncs(plan) == [(9, "0ALLREDUCE_START[delta,bf16]"),
                            (9, "0ALLREDUCE_WAIT[delta,bf16]"), (9, "0OUTER_STEP")]
    dcs = {inputs.topology.dc_of(plan.lead_gpu(r, 0)) for r in range(plan.dp)}
    assert dcs == {"east", "central", "west"}  # one replica per DC, pipelined inside it


def test_a_sync_starts_its_buckets_in_the_backward_of_its_step() -> None:
    """Torch DDP's 25 MiB buckets, of the stage's deltas in the order its backward
    produces them: each starts right after the stage's last backward (ReduceStart in the
    backward), all are waited for before the outer step."""
    inputs = api.load(PAPER)
    plan = api.plan(inputs, "diloco", {"inner_steps": "2"})
    actions = plan.actions_at(1)[plan.lead_gpu(0, 1)]
    last_backward = max(i for i, a in enumerate(actions) if a.op is Op.B)
    starts = [i for i, a in enumerate(actions) if a.op is Op.ALLREDUCE_START]
    layers = plan.layers[1]  # 10 layers of 315M weights in bf16: 25 MiB buckets
    expected = math.ceil(layers * inputs.job.model.params_per_layer * 2 / (25 * 2**20))
    assert [str(actions[i].subject) for i in starts] == [
        f"delta,bf16,b{k}/{expected}" for k in range(expected)]
    assert all(actions[i].op.is_send for i in range(last_backward + 1, starts[0]))
    step = next(i for i, a in enumerate(actions) if a.op is Op.STEP)
    assert starts[-1] < step < next(i for i, a in enumerate(actions) if a.op is Op.OUTER_STEP)
    assert set(interpret.backward_of(actions)) == set(starts)


def test_diloco_replicas_inside_one_dc_reduce_their_gradients_every_step() -> None:
    """Replicas that reduce their gradients inside their DC start their deltas after
    the step (a delta's inner step in the backward would come before that reduce)."""
    inputs = api.load(TOPOLOGIES / "two-dc.yaml", pp=1)
    plan = api.plan(inputs, "diloco", {"inner_steps": "4", "outer_bits": "4"})
    validate_plan(plan, inputs.topology)
    assert plan.dp == 4
    every_step = [a.subject for a in plan.actions[plan.lead_gpu(0, 0)] if a.op is Op.ALLREDUCE]
    assert every_step == [Collective(scope=Scope.DC)]
    assert _syncs(plan)[-3:] == [(3, "0ALLREDUCE_START[delta,fp4]"),
                                 (3, "0ALLREDUCE_WAIT[delta,fp4]"), (3, "0OUTER_STEP")]


def test_streaming_diloco_syncs_fragments_in_turn_behind_inner_steps() -> None:
    """Fragment k starts after step ceil((k + 1) H / N) - 1 and lands `overlap` steps
    later; one that lands past the cycle's end lands in the next, and in the run's first
    cycle (the opening) nowhere."""
    inputs = api.load(PAPER)
    plan = api.plan(inputs, "streaming-diloco",
                    {"inner_steps": "12", "fragments": "3", "overlap": "2",
                     "outer_bits": "4", "bucket_mb": "0"})
    validate_plan(plan, inputs.topology)
    assert plan.period == 12 and plan.outer.mixing == 0.5
    assert _syncs(plan) == [
        (1, "0ALLREDUCE_WAIT[delta,f2/3,fp4]"), (1, "0OUTER_STEP[f2/3]"),
        (3, "0ALLREDUCE_START[delta,f0/3,fp4]"),
        (5, "0ALLREDUCE_WAIT[delta,f0/3,fp4]"), (5, "0OUTER_STEP[f0/3]"),
        (7, "0ALLREDUCE_START[delta,f1/3,fp4]"),
        (9, "0ALLREDUCE_WAIT[delta,f1/3,fp4]"), (9, "0OUTER_STEP[f1/3]"),
        (11, "0ALLREDUCE_START[delta,f2/3,fp4]"),
    ]
    gpu = plan.lead_gpu(0, 0)
    assert not [a for a in plan.actions_at(1)[gpu] if a.op.is_collective]  # the opening
    assert [str(a) for a in plan.actions_at(13)[gpu] if a.op.is_collective] == [
        "0ALLREDUCE_WAIT[delta,f2/3,fp4]", "0OUTER_STEP[f2/3]"]


def test_streaming_diloco_without_overlap_blocks_and_does_not_mix() -> None:
    inputs = api.load(PAPER)
    plan = api.plan(inputs, "streaming-diloco",
                    {"inner_steps": "4", "fragments": "2", "overlap": "0", "bucket_mb": "0"})
    assert plan.outer.mixing == 0.0 and not plan.opening
    assert _syncs(plan) == [
        (1, "0ALLREDUCE_START[delta,f0/2,bf16]"), (1, "0ALLREDUCE_WAIT[delta,f0/2,bf16]"),
        (1, "0OUTER_STEP[f0/2]"), (3, "0ALLREDUCE_START[delta,f1/2,bf16]"),
        (3, "0ALLREDUCE_WAIT[delta,f1/2,bf16]"), (3, "0OUTER_STEP[f1/2]")]


def test_streaming_diloco_defaults_to_fragments_of_three_blocks() -> None:
    inputs = api.load(PAPER)  # 40 layers: 13 fragments, one sync every 7 or 8 steps
    plan = api.plan(inputs, "streaming-diloco", {"bucket_mb": "0"})
    starts = [a for _, a in _syncs(plan) if "START" in a]
    assert len(starts) == 13 and plan.period == 100


@pytest.mark.parametrize(("steps", "fragments", "overlap"), [("30", "16", "1"),
                                                             ("10", "13", "3"),
                                                             ("10", "2", "9")])
def test_streaming_diloco_runs_the_paper_s_schedule_wherever_it_is_defined(
        steps: str, fragments: str, overlap: str) -> None:
    """More fragments than steps between them (some share a step, several syncs in flight
    at once) and overlaps up to H - 1 are the paper's schedule too."""
    inputs = api.load(PAPER)
    plan = api.plan(inputs, "streaming-diloco", {"inner_steps": steps, "fragments": fragments,
                                                 "overlap": overlap, "bucket_mb": "0"})
    validate_plan(plan, inputs.topology)
    starts = [a for _, a in _syncs(plan) if "START" in a]
    assert len(starts) == int(fragments) and plan.period == int(steps)


def test_streaming_diloco_refuses_only_what_the_paper_s_schedule_cannot_be() -> None:
    inputs = api.load(PAPER)
    with pytest.raises(InputError, match="overlap 10 of inner_steps 10: a fragment syncs every "
                                         "10 steps, its next sync would start before"):
        api.plan(inputs, "streaming-diloco", {"inner_steps": "10", "fragments": "2",
                                              "overlap": "10"})
    with pytest.raises(InputError, match="41 fragments of a 40-layer model"):
        api.plan(inputs, "streaming-diloco", {"fragments": "41"})


@pytest.mark.parametrize("policy", ["diloco", "streaming-diloco"])
def test_eager_syncs_overlap_a_whole_outer_step(policy: str) -> None:
    """Each sync is waited for where the same fragment syncs again, H steps later, just
    before it starts again; the outer step follows the fresh sync's start at once. The
    run's first cycle has nothing to wait for."""
    inputs = api.load(PAPER)
    options = {"inner_steps": "4", "eager": "on", "bucket_mb": "0"}
    if policy == "streaming-diloco":
        options["fragments"] = "2"
    plan = api.plan(inputs, policy, options)
    validate_plan(plan, inputs.topology)
    assert plan.outer.eager and plan.outer.mixing == 0.0
    last = 3
    deltas = "delta,bf16" if policy == "diloco" else "delta,f1/2,bf16"
    outer = "0OUTER_STEP" if policy == "diloco" else "0OUTER_STEP[f1/2]"
    assert [a for i, a in _syncs(plan) if i == last] == [
        f"0ALLREDUCE_WAIT[{deltas}]", f"0ALLREDUCE_START[{deltas}]", outer]
    gpu = plan.lead_gpu(0, 0)
    assert [str(a) for a in plan.actions_at(last)[gpu] if a.op.is_collective] == [
        f"0ALLREDUCE_START[{deltas}]", outer]


def test_eager_syncs_in_buckets_wait_before_the_iteration_and_start_in_its_backward() -> None:
    inputs = api.load(PAPER)
    plan = api.plan(inputs, "diloco", {"inner_steps": "2", "eager": "on"})
    actions = plan.steady_actions_at(1)[plan.lead_gpu(0, 0)]
    first_compute = next(i for i, a in enumerate(actions) if a.op.is_compute)
    waits = [i for i, a in enumerate(actions) if a.op is Op.ALLREDUCE_WAIT]
    assert waits and max(waits) < first_compute
    assert set(interpret.backward_of(actions)) == {
        i for i, a in enumerate(actions) if a.op is Op.ALLREDUCE_START}


def test_dp_compressed_reduces_compressed_gradients_every_step() -> None:
    inputs = api.load(PAPER)
    plan = api.plan(inputs, "dp-compressed", {"payload": "top1%", "bucket_mb": "0"})
    validate_plan(plan, inputs.topology)
    assert plan.period == 1
    assert _syncs(plan) == [(0, "0ALLREDUCE[top1%]")]
    with pytest.raises(InputError, match="a compressed payload"):
        api.plan(inputs, "dp-compressed", {"payload": "bf16"})
    assert Collective(Reduces.GRADIENTS, payload="top1%").gathers


def test_a_run_measures_whole_cycles() -> None:
    inputs = api.load(TOPOLOGIES / "two-dc.yaml", iterations=3)
    spec = api.RunSpec.build("simulate", inputs.topology, inputs.job, policy="diloco",
                             policy_options={"inner_steps": "2"})
    from testbed.experiments.run import whole_cycles

    with pytest.warns(errors.TestbedWarning) as said:
        assert whole_cycles(spec, 2).job.iterations == 4
    assert [str(w.message) for w in said] == [
        "diloco: running 4 iterations, not 3: the plan's cycle is 2 iterations long, and a "
        "run measures whole cycles"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert whole_cycles(spec, 3) is spec


def test_results_name_each_payload_s_format_4_bits_the_paper_s_float() -> None:
    inputs = api.load(PAPER)
    plan = api.plan(inputs, "streaming-diloco", {"outer_bits": "4"})
    fp4 = plan.summary()["payloads"]["fp4"]
    assert fp4.startswith("4-bit floats E3M0 (the Streaming DiLoCo paper's)")
    int4 = api.plan(inputs, "streaming-diloco", {"outer_bits": "int4"}).summary()["payloads"]
    assert "not the 4-bit float (fp4, E3M0) the Streaming DiLoCo paper sends" in int4["int4"]
    compressed = api.plan(inputs, "dp-compressed", {"payload": "int8"}).summary()
    assert compressed["payloads"] == {
        "int8": "blockwise absmax integers in [-127, 127], an fp32 scale per 256 values"}
    assert "payloads" not in api.plan(inputs, "dp-across-dc").summary()


def test_the_diloco_family_keeps_an_outer_model_every_step_methods_do_not() -> None:
    inputs = api.load(PAPER)
    assert api.plan(inputs, "diloco", {"inner_steps": "10"}).keeps_outer_model
    assert api.plan(inputs, "streaming-diloco").keeps_outer_model
    assert not api.plan(inputs, "dp-compressed").keeps_outer_model
    assert not api.plan(inputs, "dp-across-dc").keeps_outer_model
