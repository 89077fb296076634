"""What a worker's action list means, read once for both backends: which compute, which
message goes to or comes from which stage under which name, when to all-reduce and step.

The simulator and the emulator's workers match on these steps instead of each deriving
peers and message names from the actions, so the two cannot drift apart. Pure.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, NamedTuple

from testbed.plan.collective import EVERY_STEP, Collective
from testbed.plan.model import Action, Op

_TAG = re.compile(r"([FB]):(-?\d+):(-?\d+):(-?\d+):(-?\d+)")


class Phase(StrEnum):
    """A pass through the model; also what a pipeline message carries: the forward's
    activations to the next stage, the backward's input gradients to the previous one."""

    FORWARD = "F"
    BACKWARD = "B"

    @property
    def label(self) -> Literal["forward", "backward"]:
        return "forward" if self is Phase.FORWARD else "backward"


class MessageTag(NamedTuple):
    """A pipeline message's name, for the stage that receives it: both ends derive it
    from their own action, so a receive finds its send's data without any handshake.
    (A named tuple: the simulator makes, hashes and compares one per message.)"""

    phase: Phase
    iteration: int
    replica: int
    stage: int
    """The receiving stage."""
    microbatch: int

    def __str__(self) -> str:
        return (f"{self.phase.value}:{self.iteration}:{self.replica}:{self.stage}:"
                f"{self.microbatch}")

    @classmethod
    def parse(cls, text: str) -> MessageTag:
        match = _TAG.fullmatch(text)
        if match is None:
            raise ValueError(f"not a message tag: {text!r} (expected like F:0:1:2:3)")
        phase, *numbers = match.groups()
        return cls(Phase(phase), *(int(n) for n in numbers))


@dataclass(frozen=True, slots=True)
class Compute:
    phase: Phase
    microbatch: int


@dataclass(frozen=True, slots=True)
class Send:
    """Hand a computed tensor to the neighbouring stage; the sender does not wait."""

    phase: Phase
    to_stage: int
    microbatch: int

    @property
    def op(self) -> Op:
        """The action it came from, as the arbiter's transfers name it."""
        return Op.SEND_F if self.phase is Phase.FORWARD else Op.SEND_B

    def tag(self, iteration: int, replica: int) -> MessageTag:
        return MessageTag(self.phase, iteration, replica, self.to_stage, self.microbatch)


@dataclass(frozen=True, slots=True)
class SendWait:
    """Wait until this stage's send of `microbatch` has completed: its last byte is
    acknowledged by the receiving host (what a blocking send over TCP can know)."""

    phase: Phase
    to_stage: int
    microbatch: int


@dataclass(frozen=True, slots=True)
class Receive:
    """Wait for the neighbouring stage's tensor (the GPU idles: a bubble)."""

    phase: Phase
    stage: int
    """This stage: tags name the receiver."""
    from_stage: int
    microbatch: int

    def tag(self, iteration: int, replica: int) -> MessageTag:
        return MessageTag(self.phase, iteration, replica, self.stage, self.microbatch)


@dataclass(frozen=True, slots=True)
class AllReduce:
    """Reduce with the stage's replicas (what and among whom: the collective); every
    member waits for all."""

    collective: Collective = EVERY_STEP


@dataclass(frozen=True, slots=True)
class ReduceStart:
    """Start reducing with the stage's replicas and go on; a ReduceWait with the same
    collective (in this iteration or a later one of the cycle) waits for the result."""

    collective: Collective


@dataclass(frozen=True, slots=True)
class ReduceWait:
    collective: Collective


@dataclass(frozen=True, slots=True)
class OptimizerStep:
    """Apply the iteration's gradients (the inner step, under DiLoCo)."""


@dataclass(frozen=True, slots=True)
class OuterStep:
    """Apply the reduced deltas of one fragment with the outer optimizer; the fragment's
    local parameters take the outer ones."""

    collective: Collective


@dataclass(frozen=True, slots=True)
class Prefill:
    """A place the plan reserves for inference; neither backend runs anything there (bubble
    prefills are decided at run time, at receives)."""


Step = (Compute | Send | SendWait | Receive | AllReduce | ReduceStart | ReduceWait
        | OptimizerStep | OuterStep | Prefill)


def interpret(actions: Sequence[Action], stage: int, pp: int) -> tuple[Step, ...]:
    """One step per action, in order (so a step's index is its action's, which bubble
    predictions key on). Raises ValueError for an action this stage cannot run.

    Steps are the same for every replica of a stage; a message's tag takes the replica
    with the iteration."""
    return _interpret(tuple(actions), stage, pp)


@functools.lru_cache(maxsize=128)
def _interpret(actions: tuple[Action, ...], stage: int, pp: int) -> tuple[Step, ...]:
    """Cached: the replicas of a stage, and the plans a plan search simulates, mostly
    share their action lists."""
    steps: list[Step] = []
    for action in actions:
        op, mb = action.op, action.microbatch
        if action.stage != stage:
            raise ValueError(f"stage {stage} cannot run {action}")
        fixed = _FIXED.get(op)
        if fixed is not None:
            steps.append(fixed)
            continue
        collective = _COLLECTIVE.get(op)
        if collective is not None:
            steps.append(collective(action.subject))
            continue
        if mb is None:
            raise ValueError(f"{action} needs a microbatch number")
        phase = _PHASE[op]
        if op is Op.F or op is Op.B:
            steps.append(Compute(phase, mb))
            continue
        peer = stage + _PEER[op]
        if not 0 <= peer < pp:
            raise ValueError(f"{action}: there is no stage {peer} in a {pp}-stage pipeline")
        if op is Op.SEND_F or op is Op.SEND_B:
            steps.append(Send(phase, peer, mb))
        elif op is Op.WAIT_F or op is Op.WAIT_B:
            steps.append(SendWait(phase, peer, mb))
        else:
            steps.append(Receive(phase, stage, peer, mb))
    return tuple(steps)


_FIXED: dict[Op, Step] = {Op.STEP: OptimizerStep(), Op.PREFILL: Prefill()}
_COLLECTIVE: dict[Op, type[AllReduce | ReduceStart | ReduceWait | OuterStep]] = {
    Op.ALLREDUCE: AllReduce, Op.ALLREDUCE_START: ReduceStart,
    Op.ALLREDUCE_WAIT: ReduceWait, Op.OUTER_STEP: OuterStep}
_PHASE = {Op.F: Phase.FORWARD, Op.SEND_F: Phase.FORWARD, Op.RECV_F: Phase.FORWARD,
          Op.WAIT_F: Phase.FORWARD, Op.B: Phase.BACKWARD, Op.SEND_B: Phase.BACKWARD,
          Op.RECV_B: Phase.BACKWARD, Op.WAIT_B: Phase.BACKWARD}
_PEER = {Op.SEND_F: +1, Op.RECV_F: -1, Op.WAIT_F: +1, Op.SEND_B: -1, Op.RECV_B: +1,
         Op.WAIT_B: -1}
"""The stage at the other end, relative to this one: activations go down the pipeline,
input gradients come back up."""

