"""The order rules within one stage's iteration, for the dry run (testbed.plan.dry_run):
a forward after its input arrived; a backward after its forward and the gradient from the
next stage, whole (B) or split as torch splits it (I, then W; B = I + W); a send after what
it sends was computed; a wait after its send. Pure.
"""

from __future__ import annotations

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


def apply(state: StageState, action: Action, replica: int, last: int, gpu: str,
          mail: Mail) -> bool:
    """Apply one compute or message action of stage `action.stage` (the pipeline's last
    stage is `last`); False when a receive must wait for its message, PlanError when the
    action is out of order."""
    stage, op, mb = action.stage, action.op, action.microbatch
    assert mb is not None
    if op is Op.F:
        if mb in state.forward:
            raise fail(f"{gpu}: {action} runs a second time")
        if stage > 0 and mb not in state.got_input:
            raise fail(f"{gpu}: {action} runs before {Action(stage, Op.RECV_F, mb)}")
        state.forward.add(mb)
    elif op in (Op.B, Op.I):
        if mb not in state.forward:
            raise fail(
                f"{gpu}: backward before forward: {action} before {Action(stage, Op.F, mb)}")
        if mb in state.backward or mb in state.inputs:
            raise fail(f"{gpu}: {action} runs a second time (a backward is B, or I then W)")
        if stage < last and mb not in state.got_grad:
            raise fail(f"{gpu}: {action} runs before {Action(stage, Op.RECV_B, mb)}")
        (state.backward if op is Op.B else state.inputs).add(mb)
    elif op is Op.W:
        if mb in state.backward:
            raise fail(f"{gpu}: {action} runs a second time (a backward is B, or I then W)")
        if mb not in state.inputs:
            raise fail(f"{gpu}: {action} before {Action(stage, Op.I, mb)} (the weight "
                       "gradient needs what the input gradient's backward keeps)")
        state.backward.add(mb)
    elif op is Op.SEND_F:
        if mb not in state.forward:
            raise fail(f"{gpu}: {action} sends before {Action(stage, Op.F, mb)} computed it")
        mail.add((Op.F, replica, stage + 1, mb))
        state.sent.add((op, mb))
    elif op is Op.SEND_B:
        if mb not in state.inputs and mb not in state.backward:
            raise fail(f"{gpu}: {action} sends before {Action(stage, Op.B, mb)} (or "
                       f"{Action(stage, Op.I, mb)}) computed it")
        mail.add((Op.B, replica, stage - 1, mb))
        state.sent.add((op, mb))
    elif op in (Op.WAIT_F, Op.WAIT_B):
        send = Op.SEND_F if op is Op.WAIT_F else Op.SEND_B
        if (send, mb) not in state.sent:
            raise fail(f"{gpu}: {action} waits for {Action(stage, send, mb)}, which is not "
                       "sent before it or was already waited for")
        state.sent.discard((send, mb))
    elif op in (Op.RECV_F, Op.RECV_B):
        kind = Op.F if op is Op.RECV_F else Op.B
        key = (kind, replica, stage, mb)
        if key not in mail:
            return False
        mail.discard(key)
        (state.got_input if kind is Op.F else state.got_grad).add(mb)
    else:
        raise ValueError(f"{action} is not a compute or message action")
    return True


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
