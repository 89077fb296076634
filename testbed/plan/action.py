"""One step of a GPU's list, in torch.distributed.pipelining's text form.

`2F0` is stage 2, forward, microbatch 0; `1B3` the whole backward, or split as torch's
zero-bubble schedules split it: `1I3` the backward for the input gradient (what the
previous stage waits for) and `1W3` the backward for the weight gradient (which can wait
to fill a bubble). `(0F7;7B3)OVERLAP_F_B` runs a forward and a backward of other
microbatches as one unit (DualPipeV). `1SEND_B3` sends microbatch 3's input gradient from
stage 1 to stage 0, and `1WAIT_B3` waits until that send has completed (a stage that never
waits on its sends leaves them out). An all-reduce may say what it reduces in brackets
(testbed.plan.collective): `0ALLREDUCE[delta,f1/4,int4]`; a bucket's START right after a
backward of its stage starts when that backward has the bucket's values
(`0B3`, `0ALLREDUCE_START[b0/4]`: testbed.plan.buckets).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from testbed.plan.collective import EVERY_STEP, Collective, Reduces, Scope


class Op(StrEnum):
    """What an action does, as torch's text form names it."""

    F = "F"
    """The forward of one microbatch."""
    B = "B"
    """The whole backward: input and weight gradients."""
    I = "I"  # noqa: E741 (torch's name)
    """The backward for the input gradient only (torch's BACKWARD_INPUT)."""
    W = "W"
    """The backward for the weight gradient only, after the I of its microbatch (torch's
    BACKWARD_WEIGHT)."""
    OVERLAP_F_B = "OVERLAP_F_B"
    """A forward and a backward run as one unit (its `parts`; DualPipeV)."""
    SEND_F = "SEND_F"
    """Send a microbatch's activations to the next stage."""
    RECV_F = "RECV_F"
    """Receive a microbatch's activations from the previous stage."""
    SEND_B = "SEND_B"
    """Send a microbatch's input gradient to the previous stage."""
    RECV_B = "RECV_B"
    """Receive a microbatch's gradient from the next stage."""
    WAIT_F = "WAIT_F"
    """Wait until this stage's SEND_F of that microbatch has completed."""
    WAIT_B = "WAIT_B"
    """Wait until this stage's SEND_B of that microbatch has completed."""
    ALLREDUCE = "ALLREDUCE"
    """Reduce with the stage's replicas and wait for the result."""
    ALLREDUCE_START = "ALLREDUCE_START"
    """Start a reduction; the stage goes on while it runs (Streaming DiLoCo's overlap)."""
    ALLREDUCE_WAIT = "ALLREDUCE_WAIT"
    """Wait for the reduction this stage started with the same collective."""
    STEP = "STEP"
    """The (inner) optimizer step on this iteration's gradients."""
    OUTER_STEP = "OUTER_STEP"
    """The outer optimizer step on reduced parameter deltas (DiLoCo): the fragment's outer
    parameters move, and the local ones take them."""
    PREFILL = "PREFILL"
    """A place the plan reserves for inference; neither backend runs anything there (bubble
    prefills are decided at run time)."""

    @property
    def is_compute(self) -> bool:
        """A forward or backward (or both, overlapped): work on the GPU."""
        return self in _COMPUTE_OPS

    @property
    def is_send(self) -> bool:
        """SEND_F or SEND_B."""
        return self in (Op.SEND_F, Op.SEND_B)

    @property
    def is_recv(self) -> bool:
        """RECV_F or RECV_B."""
        return self in (Op.RECV_F, Op.RECV_B)

    @property
    def is_wait(self) -> bool:
        """Waits until this stage's own send of that microbatch has completed."""
        return self in (Op.WAIT_F, Op.WAIT_B)

    @property
    def is_collective(self) -> bool:
        """Takes a collective (between brackets in the text form)."""
        return self in _COLLECTIVE_OPS

    @property
    def needs_microbatch(self) -> bool:
        """Whether its text form names a microbatch."""
        return self not in _NO_MICROBATCH_OPS


_COMPUTE_OPS = frozenset({Op.F, Op.B, Op.I, Op.W, Op.OVERLAP_F_B})
_COLLECTIVE_OPS = frozenset({Op.ALLREDUCE, Op.ALLREDUCE_START, Op.ALLREDUCE_WAIT, Op.OUTER_STEP})
_NO_MICROBATCH_OPS = frozenset({*_COLLECTIVE_OPS, Op.STEP, Op.PREFILL, Op.OVERLAP_F_B})
_PART_OPS = frozenset({Op.F, Op.B, Op.I, Op.W})
"""What an OVERLAP_F_B may run together."""

# Longest names first so that `SEND_F` is not read as `S` + ...
_ACTION = re.compile(
    r"^(\d+)(" + "|".join(sorted((op.value for op in Op), key=len, reverse=True))
    + r")(\d*)(?:\[([^\]]*)\])?$"
)
_OVERLAP = re.compile(r"^\(([^()]*)\)" + Op.OVERLAP_F_B.value + "$")
_WHOLE_DELTAS = Collective(Reduces.DELTAS)


@dataclass(frozen=True, order=True)
class Action:
    stage: int
    """-1 for an OVERLAP_F_B, whose parts name their stages (as torch has it)."""
    op: Op
    """What it does."""
    microbatch: int | None = None
    """The microbatch it works on; None for the ops that take none (steps, collectives)."""
    collective: Collective | None = None
    """For the all-reduce ops and OUTER_STEP: what, which fragment, which payload, among
    whom. None: the whole gradient (the whole deltas for OUTER_STEP), as every-step data
    parallelism all-reduces it."""
    parts: tuple[Action, ...] = ()
    """An OVERLAP_F_B's computes, in the order torch's runtime runs them."""

    def __post_init__(self) -> None:
        if self.op is Op.OVERLAP_F_B:
            if len(self.parts) < 2 or any(p.op not in _PART_OPS for p in self.parts):
                raise ValueError("an OVERLAP_F_B runs two or more of F, B, I and W")
            object.__setattr__(self, "stage", -1)
        elif self.parts:
            raise ValueError(f"{self.op.value} has no parts")
        if self.collective is not None:
            if not self.op.is_collective:
                raise ValueError(f"{self.op.value} takes no collective")
            if self.op is Op.OUTER_STEP and (self.collective.reduces is not Reduces.DELTAS
                                             or self.collective.payload
                                             or self.collective.scope is not Scope.ALL
                                             or self.collective.bucketed):
                raise ValueError("an OUTER_STEP names only its fragment (fK/N)")
            if self.collective == self.implied:  # one spelling per action
                object.__setattr__(self, "collective", None)

    @classmethod
    def overlap(cls, *parts: Action) -> Action:
        """torch's OVERLAP_F_B of these computes."""
        return cls(-1, Op.OVERLAP_F_B, parts=parts)

    @property
    def leaves(self) -> tuple[Action, ...]:
        """The computes this action runs: its parts, or itself."""
        return self.parts or (self,)

    @property
    def implied(self) -> Collective | None:
        """The collective an action without brackets stands for."""
        return _implied(self.op)

    @property
    def subject(self) -> Collective:
        """This collective action's collective, spelt or implied."""
        subject = self.collective or self.implied
        if subject is None:
            raise ValueError(f"{self} is not a collective action")
        return subject

    def __str__(self) -> str:
        if self.parts:
            return f"({';'.join(map(str, self.parts))}){self.op.value}"
        mb = "" if self.microbatch is None else str(self.microbatch)
        implied = self.implied
        spec = "" if self.collective is None or implied is None else (
            f"[{self.collective.spelled(implied)}]")
        return f"{self.stage}{self.op.value}{mb}{spec}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """An action from its text form (`2F0`, `1SEND_B3`, `0ALLREDUCE[delta,int4]`)."""
        overlap = _OVERLAP.match(text.strip())
        if overlap:
            try:
                return cls.overlap(*(cls.parse(p) for p in overlap.group(1).split(";")))
            except ValueError as exc:
                raise ValueError(f"{text!r}: {exc}") from None
        match = _ACTION.match(text.strip())
        if not match:
            raise ValueError(f"not an action: {text!r} (expected like 0F1, 1I0, 2SEND_B0, "
                             "(0F3;7B1)OVERLAP_F_B, 0ALLREDUCE_START[delta,f1/4,int4])")
        stage, op_text, mb_text, spec = match.groups()
        op = Op(op_text)
        microbatch = int(mb_text) if mb_text else None
        if op is Op.OVERLAP_F_B:
            raise ValueError(f"{text!r}: an OVERLAP_F_B is written (0F3;7B1)OVERLAP_F_B")
        if op.needs_microbatch and microbatch is None:
            raise ValueError(f"{text!r}: {op.value} needs a microbatch number")
        if not op.needs_microbatch and microbatch is not None:
            raise ValueError(f"{text!r}: {op.value} takes no microbatch number")
        if spec is not None and not op.is_collective:
            raise ValueError(f"{text!r}: {op.value} takes nothing in brackets")
        try:
            collective = Collective.parse(spec, _implied(op)) if spec is not None else None
            return cls(int(stage), op, microbatch, collective)
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc}") from None


def _implied(op: Op) -> Collective | None:
    if not op.is_collective:
        return None
    return _WHOLE_DELTAS if op is Op.OUTER_STEP else EVERY_STEP
