"""The DiLoCo family's plans: what syncs when, and the options' errors. (What the syncs
move and cost is measured in the simulator's tests.)"""

from __future__ import annotations

import warnings

import pytest

from testbed import api, errors
from testbed.errors import InputError
from testbed.plan import Op, validate_plan
from testbed.plan.collective import Collective, Reduces, Scope
from tests.conftest import TOPOLOGIES

PAPER = TOPOLOGIES / "paper-3dc.yaml"


def _syncs(plan: api.Plan, stage: int = 0) -> list[tuple[int, str]]:
    gpu = plan.lead_gpu(0, stage)
    return [(i, str(a)) for i in range(plan.period) for a in plan.actions_at(i)[gpu]
            if a.op.is_collective]


def test_diloco_syncs_every_h_steps_with_an_outer_step() -> None:
    inputs = api.load(PAPER)
    plan = api.plan(inputs, "diloco", {"inner_steps": "10"})
    validate_plan(plan, inputs.topology)
    assert plan.period == 10 and (plan.outer.lr, plan.outer.momentum) == (0.7, 0.9)
    assert _syncs(plan) == [(9, "0ALLREDUCE[delta,bf16]"), (9, "0OUTER_STEP")]
    dcs = {inputs.topology.dc_of(plan.lead_gpu(r, 0)) for r in range(plan.dp)}
    assert dcs == {"east", "central", "west"}  # one replica per DC, pipelined inside it


def test_diloco_replicas_inside_one_dc_reduce_their_gradients_every_step() -> None:
    inputs = api.load(TOPOLOGIES / "two-dc.yaml", pp=1)
    plan = api.plan(inputs, "diloco", {"inner_steps": "4", "outer_bits": "4"})
    validate_plan(plan, inputs.topology)
    assert plan.dp == 4
    every_step = [a.subject for a in plan.actions[plan.lead_gpu(0, 0)] if a.op is Op.ALLREDUCE]
    assert every_step == [Collective(scope=Scope.DC)]
    assert _syncs(plan)[-2:] == [(3, "0ALLREDUCE[delta,int4]"), (3, "0OUTER_STEP")]


def test_streaming_diloco_syncs_fragments_in_turn_behind_inner_steps() -> None:
    inputs = api.load(PAPER)
    plan = api.plan(inputs, "streaming-diloco",
                    {"inner_steps": "12", "fragments": "3", "overlap": "2", "outer_bits": "4"})
    validate_plan(plan, inputs.topology)
    assert plan.period == 12 and plan.outer.mixing == 0.5
    assert _syncs(plan) == [
        (1, "0ALLREDUCE_START[delta,f0/3,int4]"),
        (3, "0ALLREDUCE_WAIT[delta,f0/3,int4]"), (3, "0OUTER_STEP[f0/3]"),
        (5, "0ALLREDUCE_START[delta,f1/3,int4]"),
        (7, "0ALLREDUCE_WAIT[delta,f1/3,int4]"), (7, "0OUTER_STEP[f1/3]"),
        (9, "0ALLREDUCE_START[delta,f2/3,int4]"),
        (11, "0ALLREDUCE_WAIT[delta,f2/3,int4]"), (11, "0OUTER_STEP[f2/3]"),
    ]


def test_streaming_diloco_without_overlap_blocks_and_does_not_mix() -> None:
    inputs = api.load(PAPER)
    plan = api.plan(inputs, "streaming-diloco",
                    {"inner_steps": "4", "fragments": "2", "overlap": "0"})
    assert plan.outer.mixing == 0.0
    assert _syncs(plan) == [(1, "0ALLREDUCE[delta,f0/2,bf16]"), (1, "0OUTER_STEP[f0/2]"),
                            (3, "0ALLREDUCE[delta,f1/2,bf16]"), (3, "0OUTER_STEP[f1/2]")]


def test_streaming_diloco_defaults_to_fragments_of_three_blocks() -> None:
    inputs = api.load(PAPER)  # 40 layers: 13 fragments, one sync every 7 or 8 steps
    plan = api.plan(inputs, "streaming-diloco")
    starts = [a for _, a in _syncs(plan) if "START" in a]
    assert len(starts) == 13 and plan.period == 100


def test_streaming_diloco_refuses_an_overlap_that_runs_into_the_next_sync() -> None:
    inputs = api.load(PAPER)
    with pytest.raises(InputError, match="overlap 5 needs at least 6 inner steps between"):
        api.plan(inputs, "streaming-diloco", {"inner_steps": "10", "fragments": "2",
                                              "overlap": "5"})


def test_dp_compressed_reduces_compressed_gradients_every_step() -> None:
    inputs = api.load(PAPER)
    plan = api.plan(inputs, "dp-compressed", {"payload": "top1%"})
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


def test_results_name_each_payload_s_format_int4_an_integer_one() -> None:
    inputs = api.load(PAPER)
    plan = api.plan(inputs, "streaming-diloco", {"outer_bits": "4"})
    int4 = plan.summary()["payloads"]["int4"]
    assert int4.startswith("blockwise absmax integers in [-7, 7]")
    assert "not the 4-bit float (FP4, E3M0) the Streaming DiLoCo paper sends" in int4
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
