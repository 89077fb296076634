"""What a worker's action list means, read once for both backends: which compute, which
message goes to or comes from which stage under which name, when to all-reduce and step.

The simulator and the emulator's workers match on these steps instead of each deriving
peers and message names from the actions, so the two cannot drift apart. Pure.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, NamedTuple

from testbed.plan.collective import Collective
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


class Part(StrEnum):
    """Which part of a backward a compute runs."""

    WHOLE = ""
    """All of it (B), or a forward."""
    INPUT = "I"
    """The input gradient only: what the previous stage waits for (torch's I)."""
    WEIGHT = "W"
    """The weight gradient only, from what the I of the same microbatch kept (torch's W);
    nothing waits for it but the step."""


@dataclass(frozen=True, slots=True)
class Compute:
    phase: Phase
    microbatch: int
    stage: int
    """Whose layers: a GPU may hold several stages."""
    part: Part = Part.WHOLE


@dataclass(frozen=True, slots=True)
class Overlapped:
    """Computes run as one unit (torch's OVERLAP_F_B, DualPipeV's forward of one
    microbatch beside the backward of another): the inputs of all parts are received
    before it and the outputs sent after it. Torch's runtime runs the parts one after the
    other."""

    parts: tuple[Compute, ...]


@dataclass(frozen=True, slots=True)
class Send:
    """Hand a computed tensor to the neighbouring stage; the sender does not wait."""

    phase: Phase
    to_stage: int
    microbatch: int
    local: bool = False
    """The receiving stage is on this GPU (virtual stages): the tensor is handed over in
    memory, nothing crosses a network, and the send is complete at once."""

    @property
    def op(self) -> Op:
        """The action it came from, as the arbiter's transfers name it."""
        return Op.SEND_F if self.phase is Phase.FORWARD else Op.SEND_B

    @property
    def stage(self) -> int:
        """The sending stage."""
        return self.to_stage - 1 if self.phase is Phase.FORWARD else self.to_stage + 1

    def tag(self, iteration: int, replica: int) -> MessageTag:
        return MessageTag(self.phase, iteration, replica, self.to_stage, self.microbatch)


@dataclass(frozen=True, slots=True)
class SendWait:
    """Wait until this stage's send of `microbatch` has completed: its last byte is
    acknowledged by the receiving host (what a blocking send over TCP can know)."""

    phase: Phase
    to_stage: int
    microbatch: int
    local: bool = False
    """The send was handed over on this GPU: complete already."""

    @property
    def stage(self) -> int:
        """The sending stage."""
        return self.to_stage - 1 if self.phase is Phase.FORWARD else self.to_stage + 1


@dataclass(frozen=True, slots=True)
class Receive:
    """Wait for the neighbouring stage's tensor (the GPU idles: a bubble)."""

    phase: Phase
    stage: int
    """This stage: tags name the receiver."""
    from_stage: int
    microbatch: int
    local: bool = False
    """The sending stage is on this GPU: take the tensor its send left in memory."""

    def tag(self, iteration: int, replica: int) -> MessageTag:
        return MessageTag(self.phase, iteration, replica, self.stage, self.microbatch)


@dataclass(frozen=True, slots=True)
class AllReduce:
    """Reduce the stage's gradients or deltas with its replicas (what and among whom: the
    collective); every member waits for all."""

    collective: Collective
    stage: int


@dataclass(frozen=True, slots=True)
class ReduceStart:
    """Start reducing with the stage's replicas and go on; a ReduceWait of the same stage
    and collective (in this iteration or a later one of the cycle) waits for the result.

    One right after a backward of its stage (sends between them aside: `backward`) is in
    that backward: it starts as the backward has its values (testbed.plan.buckets), as
    torch's DistributedDataParallel starts a bucket. A delta's parameters then take their
    inner step in the backward as their gradients are final (the optimizer in the
    backward), so that the deltas include this iteration's step."""

    collective: Collective
    stage: int
    backward: int = -1
    """The index of the compute step whose backward it starts in; -1: it starts where it
    stands."""


@dataclass(frozen=True, slots=True)
class ReduceWait:
    collective: Collective
    stage: int


@dataclass(frozen=True, slots=True)
class OptimizerStep:
    """Apply the stage's gradients of the iteration (the inner step, under DiLoCo)."""

    stage: int


@dataclass(frozen=True, slots=True)
class OuterStep:
    """Apply the reduced deltas of one fragment with the outer optimizer; the fragment's
    local parameters take the outer ones."""

    collective: Collective
    stage: int


@dataclass(frozen=True, slots=True)
class Prefill:
    """A place the plan reserves for inference; neither backend runs anything there (bubble
    prefills are decided at run time, at receives)."""


Step = (Compute | Overlapped | Send | SendWait | Receive | AllReduce | ReduceStart
        | ReduceWait | OptimizerStep | OuterStep | Prefill)


def interpret(actions: Sequence[Action], stages: int | Iterable[int], pp: int
              ) -> tuple[Step, ...]:
    """One step per action, in order (so a step's index is its action's, which bubble
    predictions key on), for a GPU that holds `stages` (one, or several under virtual
    stages: a message between two of them is `local`). Raises ValueError for an action
    this GPU cannot run.

    Steps are the same for every replica of a stage; a message's tag takes the replica
    with the iteration."""
    held = (stages,) if isinstance(stages, int) else tuple(sorted(stages))
    return _interpret(tuple(actions), held, pp)


@functools.lru_cache(maxsize=128)
def _interpret(actions: tuple[Action, ...], stages: tuple[int, ...], pp: int
               ) -> tuple[Step, ...]:
    """Cached: the replicas of a stage, and the plans a plan search simulates, mostly
    share their action lists."""
    steps: list[Step] = []
    in_backward = backward_of(actions)
    for index, action in enumerate(actions):
        if action.op is Op.OVERLAP_F_B:
            steps.append(Overlapped(tuple(_compute(part, stages) for part in action.parts)))
        elif action.op in _PART:
            steps.append(_compute(action, stages))
        elif index in in_backward:
            _held(action, stages)
            steps.append(ReduceStart(action.subject, action.stage, in_backward[index]))
        else:
            steps.append(_step(action, stages, pp))
    return tuple(steps)


def backward_of(actions: Sequence[Action]) -> dict[int, int]:
    """The STARTs that are in a backward (see ReduceStart): their index, and the index of
    the compute whose backward of their stage they follow, with only sends and other such
    STARTs between."""
    found: dict[int, int] = {}
    compute, stages = -1, frozenset[int]()
    for index, action in enumerate(actions):
        if action.op.is_compute:
            compute = index
            stages = frozenset(leaf.stage for leaf in action.leaves
                               if leaf.op in (Op.B, Op.W))
        elif action.op is Op.ALLREDUCE_START and action.stage in stages:
            found[index] = compute
        elif not action.op.is_send:
            stages = frozenset()
    return found


def _held(action: Action, stages: tuple[int, ...]) -> None:
    if action.stage not in stages:
        held = f"stage {stages[0]}" if len(stages) == 1 else \
            f"stages {', '.join(map(str, stages))}"
        raise ValueError(f"a GPU holding {held} cannot run {action}")


def _compute(action: Action, stages: tuple[int, ...]) -> Compute:
    _held(action, stages)
    if action.microbatch is None:
        raise ValueError(f"{action} needs a microbatch number")
    return Compute(_PHASE[action.op], action.microbatch, action.stage, _PART[action.op])


def _step(action: Action, stages: tuple[int, ...], pp: int) -> Step:
    op, mb, stage = action.op, action.microbatch, action.stage
    _held(action, stages)
    if op is Op.PREFILL:
        return Prefill()
    if op is Op.STEP:
        return OptimizerStep(stage)
    collective = _COLLECTIVE.get(op)
    if collective is not None:
        return collective(action.subject, stage)
    if mb is None:
        raise ValueError(f"{action} needs a microbatch number")
    phase = _PHASE[op]
    peer = stage + _PEER[op]
    if not 0 <= peer < pp:
        raise ValueError(f"{action}: there is no stage {peer} in a {pp}-stage pipeline")
    local = peer in stages
    if op is Op.SEND_F or op is Op.SEND_B:
        return Send(phase, peer, mb, local)
    if op is Op.WAIT_F or op is Op.WAIT_B:
        return SendWait(phase, peer, mb, local)
    return Receive(phase, stage, peer, mb, local)


_COLLECTIVE: dict[Op, type[AllReduce | ReduceStart | ReduceWait | OuterStep]] = {
    Op.ALLREDUCE: AllReduce, Op.ALLREDUCE_START: ReduceStart,
    Op.ALLREDUCE_WAIT: ReduceWait, Op.OUTER_STEP: OuterStep}
_PART = {Op.F: Part.WHOLE, Op.B: Part.WHOLE, Op.I: Part.INPUT, Op.W: Part.WEIGHT}
_PHASE = {Op.F: Phase.FORWARD, Op.SEND_F: Phase.FORWARD, Op.RECV_F: Phase.FORWARD,
          Op.WAIT_F: Phase.FORWARD, Op.B: Phase.BACKWARD, Op.I: Phase.BACKWARD,
          Op.W: Phase.BACKWARD, Op.SEND_B: Phase.BACKWARD, Op.RECV_B: Phase.BACKWARD,
          Op.WAIT_B: Phase.BACKWARD}
_PEER = {Op.SEND_F: +1, Op.RECV_F: -1, Op.WAIT_F: +1, Op.SEND_B: -1, Op.RECV_B: +1,
         Op.WAIT_B: -1}
"""The stage at the other end, relative to this one: activations go down the pipeline,
input gradients come back up."""
