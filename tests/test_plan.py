from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.errors import InputError, PlanError
from testbed.job.load import parse_job
from testbed.plan import Action, Op, parse_plan_csv, plan_grid, plan_to_csv, validate_plan
from testbed.plan.schedules import gpipe_compute, one_f_one_b_compute
from testbed.policy import training_policy
from testbed.policy.api import PlanningContext
from testbed.topology import parse_topology

TWO_DC = parse_topology(
    {
        "datacenters": [{"name": "east", "gpus": 2}, {"name": "west", "gpus": 2}],
        "wan": [{"between": ["east", "west"], "latency": "20ms", "bandwidth": "1Gbit"}],
    },
    "two.yaml",
)
JOB = parse_job({"model": "tiny", "microbatches": 4})


def _plan(policy: str = "gpipe") -> Any:
    return training_policy(policy).plan(TWO_DC, JOB, PlanningContext())


@pytest.mark.parametrize(
    "text", ["0F0", "12B3", "2SEND_F0", "1RECV_B11", "3ALLREDUCE", "0STEP", "4PREFILL"]
)
def test_action_text_round_trip(text: str) -> None:
    assert str(Action.parse(text)) == text


@pytest.mark.parametrize("bad", ["F0", "0X1", "0F", "0STEP1", "", "0SEND_F"])
def test_bad_actions(bad: str) -> None:
    with pytest.raises(ValueError):
        Action.parse(bad)


@pytest.mark.parametrize("policy", ["gpipe", "1f1b", "dp-across-dc"])
def test_csv_round_trip(policy: str) -> None:
    plan = _plan(policy)
    again = parse_plan_csv(plan_to_csv(plan), "p.csv")
    assert again == plan
    validate_plan(again, TWO_DC)


def test_csv_errors_are_located() -> None:
    text = plan_to_csv(_plan())
    broken = text.replace("0SEND_F1", "0SEND_X1", 1)
    with pytest.raises(InputError, match=r"p.csv: line \d+: bad action"):
        parse_plan_csv(broken, "p.csv")
    with pytest.raises(InputError, match="missing meta row"):
        parse_plan_csv("place,0,0,east-0\n", "p.csv")


def _with_actions(plan: Any, gpu: str, actions: list[str]) -> Any:
    new = dict(plan.actions)
    new[gpu] = tuple(Action.parse(a) for a in actions)
    return replace(plan, actions=new)


def test_validator_names_backward_before_forward() -> None:
    plan = _plan()
    actions = [str(a) for a in plan.actions["east-0"]]
    i, j = actions.index("0F3"), actions.index("0B3")
    actions[i], actions[j] = actions[j], actions[i]
    with pytest.raises(PlanError, match=r"east-0: backward before forward: 0B3 before 0F3"):
        validate_plan(_with_actions(plan, "east-0", actions), TWO_DC)


def test_validator_names_unmatched_send() -> None:
    plan = _plan()
    actions = [str(a) for a in plan.actions["west-0"] if str(a) != "1RECV_F2"]
    with pytest.raises(
        PlanError, match="unmatched send: east-0 0SEND_F2 has no 1RECV_F2 on west-0"
    ):
        validate_plan(_with_actions(plan, "west-0", actions), TWO_DC)


def test_validator_names_deadlock() -> None:
    plan = _plan()
    # stage 1 waits for the gradient of microbatch 0 before it has run any forward
    west = [str(a) for a in plan.actions["west-0"]]
    east = [str(a) for a in plan.actions["east-0"]]
    east.remove("0RECV_B0")
    east.insert(0, "0RECV_B0")
    with pytest.raises(PlanError, match="deadlock: east-0 waits at 0RECV_B0 for west-0"):
        validate_plan(_with_actions(plan, "east-0", east), TWO_DC)
    assert west  # unchanged


def test_validator_names_gpu_used_twice() -> None:
    plan = _plan()
    placement = dict(plan.placement)
    placement[(1, 1)] = placement[(0, 1)]
    with pytest.raises(PlanError, match="GPU west-0 is used by replica 0 stage 1 and by replica 1"):
        validate_plan(replace(plan, placement=placement), TWO_DC)


def test_validator_requires_allreduce_before_step() -> None:
    plan = _plan()
    actions = [str(a) for a in plan.actions["east-0"] if a.op is not Op.ALLREDUCE]
    with pytest.raises(PlanError):
        validate_plan(_with_actions(plan, "east-0", actions), TWO_DC)


def _torch_order(cls_name: str, stages: int, microbatches: int) -> dict[int, list[str]]:
    """Compute actions of torch's own schedule, read from its pipeline order."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    cls = getattr(schedules, cls_name)
    obj = object.__new__(cls)
    obj._num_stages = stages
    obj._n_microbatches = microbatches
    order = cls._get_pipeline_order(obj)
    return {
        rank: [
            str(a)
            for a in actions
            if a is not None and str(a)[-1:].isdigit() and a.computation_type.value in ("F", "B")
        ]
        for rank, actions in order.items()
    }


@given(st.integers(1, 8), st.integers(1, 16))
def test_gpipe_matches_torch(stages: int, microbatches: int) -> None:
    torch_order = _torch_order("ScheduleGPipe", stages, microbatches)
    for stage in range(stages):
        ours = [str(a) for a in gpipe_compute(stage, stages, microbatches)]
        assert ours == torch_order[stage]


@given(st.integers(1, 8), st.data())
def test_1f1b_matches_torch(stages: int, data: st.DataObject) -> None:
    microbatches = data.draw(st.integers(stages, 16))  # torch's 1F1B needs m >= p
    torch_order = _torch_order("Schedule1F1B", stages, microbatches)
    for stage in range(stages - 1):
        ours = [str(a) for a in one_f_one_b_compute(stage, stages, microbatches)]
        assert ours == torch_order[stage]
    # torch's order generator starts the last stage at microbatch 1 when it has no warm-up
    # forwards (its runtime does not); the last stage simply alternates F and B.
    last = stages - 1
    ours = [str(a) for a in one_f_one_b_compute(last, stages, microbatches)]
    assert ours == [f"{last}{op}{mb}" for mb in range(microbatches) for op in "FB"]


def test_grid_shows_every_worker() -> None:
    grid = plan_grid(_plan("1f1b"))
    assert "r1s1" in grid and "west-1" in grid and "1ALLREDUCE" in grid


def test_replicas_alike_are_dry_run_once_and_one_that_differs_is_checked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """build_plan gives a stage's replicas one action list: the dry run runs one replica
    of each class alike (the others join its collectives with it); a replica whose list
    differs, even by one action, is run, and its error named."""
    from testbed.plan import dry_run

    plan = _plan("1f1b")
    assert plan.dp == 2 and plan.actions["east-0"] is plan.actions["east-1"]
    executed: list[Any] = []
    real = dry_run._CycleRun._execute

    def counted(self: Any, gpu: str, runner: Any, *args: Any) -> Any:
        executed.append(runner.replica)
        return real(self, gpu, runner, *args)

    monkeypatch.setattr(dry_run._CycleRun, "_execute", counted)
    validate_plan(plan, TWO_DC)
    assert set(executed) == {0}
    actions = [str(a) for a in plan.actions["east-1"]]
    i, j = actions.index("0F3"), actions.index("0B3")
    actions[i], actions[j] = actions[j], actions[i]
    with pytest.raises(PlanError, match=r"east-1: backward before forward: 0B3 before 0F3"):
        validate_plan(_with_actions(plan, "east-1", actions), TWO_DC)
