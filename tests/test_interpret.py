"""The plan interpreter both backends run: every send meets its receive under one tag, and
the tag's wire form is the one workers have always used."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.plan.interpret import (
    AllReduce,
    Compute,
    MessageTag,
    OptimizerStep,
    Phase,
    Prefill,
    Receive,
    Send,
    Step,
    interpret,
)
from testbed.plan.model import Action, Op
from testbed.plan.schedules import stage_actions

SCHEDULES = st.sampled_from(["gpipe", "1f1b", "1f1b+1", "1f1b+3"])


def _pipeline(schedule: str, stages: int, microbatches: int, replicas: int
              ) -> dict[tuple[int, int], tuple[Step, ...]]:
    return {
        (r, s): interpret(stage_actions(schedule, s, stages, microbatches, replicas), s, stages)
        for r in range(replicas)
        for s in range(stages)
    }


@given(SCHEDULES, st.integers(1, 5), st.integers(1, 8), st.integers(1, 3), st.integers(0, 9))
def test_every_send_meets_one_receive_with_its_tag(schedule: str, stages: int,
                                                   microbatches: int, replicas: int,
                                                   iteration: int) -> None:
    steps = _pipeline(schedule, stages, microbatches, replicas)
    sent: Counter[tuple[tuple[int, int], MessageTag]] = Counter()
    received: Counter[tuple[tuple[int, int], MessageTag]] = Counter()
    for (replica, stage), mine in steps.items():
        for step in mine:
            if isinstance(step, Send):
                assert step.to_stage == stage + (1 if step.phase is Phase.FORWARD else -1)
                sent[((replica, step.to_stage), step.tag(iteration, replica))] += 1
            elif isinstance(step, Receive):
                assert step.stage == stage
                assert step.from_stage == stage - (1 if step.phase is Phase.FORWARD else -1)
                received[((replica, stage), step.tag(iteration, replica))] += 1
    assert sent == received
    assert set(sent.values()) <= {1}  # no tag names two messages
    expected = 2 * replicas * (stages - 1) * microbatches
    assert sum(sent.values()) == expected


@given(SCHEDULES, st.integers(1, 5), st.integers(1, 8), st.integers(1, 3))
def test_one_step_per_action_in_order(schedule: str, stages: int, microbatches: int,
                                      replicas: int) -> None:
    kinds = {Op.F: Compute, Op.B: Compute, Op.SEND_F: Send, Op.SEND_B: Send,
             Op.RECV_F: Receive, Op.RECV_B: Receive, Op.ALLREDUCE: AllReduce,
             Op.STEP: OptimizerStep}
    for stage in range(stages):
        actions = stage_actions(schedule, stage, stages, microbatches, replicas)
        steps = interpret(actions, stage, stages)
        assert len(steps) == len(actions)
        for action, step in zip(actions, steps, strict=True):
            assert isinstance(step, kinds[action.op])
            if isinstance(step, Compute | Send | Receive):
                assert step.microbatch == action.microbatch
                assert step.phase is (Phase.FORWARD if action.op in (Op.F, Op.SEND_F, Op.RECV_F)
                                      else Phase.BACKWARD)


def test_compute_labels_and_send_ops() -> None:
    assert Phase.FORWARD.label == "forward"
    assert Phase.BACKWARD.label == "backward"
    assert Send(Phase.FORWARD, 1, 0).op is Op.SEND_F
    assert Send(Phase.BACKWARD, 0, 0).op is Op.SEND_B


def test_prefill_is_a_step_of_its_own() -> None:
    steps = interpret([Action(0, Op.PREFILL), Action(0, Op.STEP)], 0, 1)
    assert steps == (Prefill(), OptimizerStep(0))


def test_wire_form_is_unchanged() -> None:
    """Workers name messages `kind:iteration:replica:receiving stage:microbatch`."""
    send = interpret([Action(1, Op.SEND_F, 3)], 1, 4)[0]
    assert isinstance(send, Send)
    assert str(send.tag(7, 2)) == "F:7:2:2:3"
    back = interpret([Action(1, Op.SEND_B, 0)], 1, 4)[0]
    assert isinstance(back, Send)
    assert str(back.tag(0, 0)) == "B:0:0:0:0"
    receive = interpret([Action(2, Op.RECV_F, 3)], 2, 4)[0]
    assert isinstance(receive, Receive)
    assert str(receive.tag(7, 2)) == "F:7:2:2:3"


@given(st.sampled_from(list(Phase)), st.integers(0, 10**6), st.integers(0, 999),
       st.integers(0, 999), st.integers(0, 10**4))
def test_tag_text_round_trip(phase: Phase, iteration: int, replica: int, stage: int,
                             microbatch: int) -> None:
    tag = MessageTag(phase, iteration, replica, stage, microbatch)
    text = str(tag)
    assert text == f"{phase.value}:{iteration}:{replica}:{stage}:{microbatch}"
    assert MessageTag.parse(text) == tag
    assert hash(MessageTag.parse(text)) == hash(tag)


@pytest.mark.parametrize("bad", ["", "F:1:2:3", "X:0:0:0:0", "F:0:0:0:0:0", "F:a:0:0:0",
                                 "AR0:1:rs0", "F:0:0:0:0 ", "F:0:0:0:0\n"])
def test_bad_tags(bad: str) -> None:
    with pytest.raises(ValueError):
        MessageTag.parse(bad)


@pytest.mark.parametrize(
    ("actions", "stage", "message"),
    [
        ([Action(1, Op.F, 0)], 0, "cannot run"),
        ([Action(0, Op.SEND_B, 0)], 0, "no stage -1"),
        ([Action(1, Op.SEND_F, 0)], 1, "no stage 2"),
        ([Action(0, Op.RECV_F, 0)], 0, "no stage -1"),
        ([Action(0, Op.F)], 0, "needs a microbatch"),
    ],
)
def test_actions_a_worker_cannot_run(actions: list[Action], stage: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        interpret(actions, stage, 2)
