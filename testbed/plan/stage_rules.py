"""The order rules within one stage's iteration, for the dry run (testbed.plan.dry_run):
a forward after its input arrived; a backward after its forward and the gradient from the
next stage, whole (B) or split as torch splits it (I, then W; B = I + W); a send after what
it sends was computed; a wait after its send. Pure.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.errors import PlanError
from testbed.plan.model import Action, Op

Mail = set[tuple[Op, int, int, int]]
"""Messages delivered and not yet received: (F or B, replica, receiving stage, microbatch)."""


def fail(message: str) -> PlanError:
    return PlanError(f"invalid plan: {message}")


@dataclass
class StageState:
    """One (replica, stage) within one iteration."""

    forward: set[int] = field(default_factory=set)
    inputs: set[int] = field(default_factory=set)
    """Microbatches whose I ran: the input gradient exists, the weight gradient is to come."""
    backward: set[int] = field(default_factory=set)
    """Microbatches whose backward is complete: B, or I and then W."""
    got_input: set[int] = field(default_factory=set)
    got_grad: set[int] = field(default_factory=set)
    sent: set[tuple[Op, int]] = field(default_factory=set)
    """Sends not yet waited for."""
    reduced: bool = False
    """Its gradients were all-reduced across every replica before the step."""
    reduced_any: bool = False
    stepped: bool = False


@dataclass(frozen=True)
class _Where:
    """What a rule needs beyond the stage's state: whose stage, the pipeline's last, the
    GPU it names in errors and the mail between stages."""

    replica: int
    last: int
    gpu: str
    mail: Mail


def apply(state: StageState, action: Action, replica: int, last: int, gpu: str,
          mail: Mail) -> bool:
    """Apply one compute or message action of stage `action.stage` (the pipeline's last
    stage is `last`); False when a receive must wait for its message, PlanError when the
    action is out of order."""
    assert action.microbatch is not None
    rule = _RULES.get(action.op)
    if rule is None:
        raise ValueError(f"{action} is not a compute or message action")
    return rule(state, action, action.microbatch, _Where(replica, last, gpu, mail))


def _forward(state: StageState, action: Action, mb: int, at: _Where) -> bool:
    if mb in state.forward:
        raise fail(f"{at.gpu}: {action} runs a second time")
    if action.stage > 0 and mb not in state.got_input:
        raise fail(f"{at.gpu}: {action} runs before {Action(action.stage, Op.RECV_F, mb)}")
    state.forward.add(mb)
    return True


def _backward(state: StageState, action: Action, mb: int, at: _Where) -> bool:
    """B, or I: the input gradient's half of a split backward."""
    stage, gpu = action.stage, at.gpu
    if mb not in state.forward:
        raise fail(
            f"{gpu}: backward before forward: {action} before {Action(stage, Op.F, mb)}")
    if mb in state.backward or mb in state.inputs:
        raise fail(f"{gpu}: {action} runs a second time (a backward is B, or I then W)")
    if stage < at.last and mb not in state.got_grad:
        raise fail(f"{gpu}: {action} runs before {Action(stage, Op.RECV_B, mb)}")
    (state.backward if action.op is Op.B else state.inputs).add(mb)
    return True


def _weights(state: StageState, action: Action, mb: int, at: _Where) -> bool:
    """W: the weight gradients' half of a split backward."""
    if mb in state.backward:
        raise fail(f"{at.gpu}: {action} runs a second time (a backward is B, or I then W)")
    if mb not in state.inputs:
        raise fail(f"{at.gpu}: {action} before {Action(action.stage, Op.I, mb)} (the weight "
                   "gradient needs what the input gradient's backward keeps)")
    state.backward.add(mb)
    return True


def _send_forward(state: StageState, action: Action, mb: int, at: _Where) -> bool:
    stage = action.stage
    if mb not in state.forward:
        raise fail(f"{at.gpu}: {action} sends before {Action(stage, Op.F, mb)} computed it")
    at.mail.add((Op.F, at.replica, stage + 1, mb))
    state.sent.add((action.op, mb))
    return True


def _send_backward(state: StageState, action: Action, mb: int, at: _Where) -> bool:
    stage = action.stage
    if mb not in state.inputs and mb not in state.backward:
        raise fail(f"{at.gpu}: {action} sends before {Action(stage, Op.B, mb)} (or "
                   f"{Action(stage, Op.I, mb)}) computed it")
    at.mail.add((Op.B, at.replica, stage - 1, mb))
    state.sent.add((action.op, mb))
    return True


def _wait(state: StageState, action: Action, mb: int, at: _Where) -> bool:
    send = Op.SEND_F if action.op is Op.WAIT_F else Op.SEND_B
    if (send, mb) not in state.sent:
        raise fail(f"{at.gpu}: {action} waits for {Action(action.stage, send, mb)}, which is "
                   "not sent before it or was already waited for")
    state.sent.discard((send, mb))
    return True


def _receive(state: StageState, action: Action, mb: int, at: _Where) -> bool:
    kind = Op.F if action.op is Op.RECV_F else Op.B
    key = (kind, at.replica, action.stage, mb)
    if key not in at.mail:
        return False
    at.mail.discard(key)
    (state.got_input if kind is Op.F else state.got_grad).add(mb)
    return True


_RULES: dict[Op, Callable[[StageState, Action, int, _Where], bool]] = {
    Op.F: _forward, Op.B: _backward, Op.I: _backward, Op.W: _weights,
    Op.SEND_F: _send_forward, Op.SEND_B: _send_backward,
    Op.WAIT_F: _wait, Op.WAIT_B: _wait, Op.RECV_F: _receive, Op.RECV_B: _receive,
}
"""Each compute or message action's rule, by its op."""


def check_complete(state: StageState, microbatches: int, gpu: str, stage: int,
                   name_stage: bool) -> None:
    """PlanError for what the stage left undone at the end of its iteration (naming the
    stage where its GPU holds several)."""
    of = f" of stage {stage}" if name_stage else ""
    for mb in range(microbatches):
        if mb not in state.forward:
            raise fail(f"{gpu} never runs the forward of microbatch {mb}{of}")
        if mb in state.inputs and mb not in state.backward:
            raise fail(f"{gpu} runs {Action(stage, Op.I, mb)} but never "
                       f"{Action(stage, Op.W, mb)}")
        if mb not in state.backward:
            raise fail(f"{gpu} never runs the backward of microbatch {mb}{of}")
    if not state.stepped:
        raise fail(f"{gpu} never runs the optimizer step{of}")
