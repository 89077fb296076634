"""A (replica, stage) as the simulator runs it: its interpreted steps and where it is in
them; the transfers, all-reduces and prefills modules all move it along."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Unpack

from testbed.plan.interpret import Phase, SendWait, Step
from testbed.spans import Span, SpanDetail, SpanKind

SendKey = tuple[int, Phase, int]
"""(iteration, phase, microbatch) of one of a worker's sends."""


@dataclass
class SimWorker:
    index: int
    replica: int
    stage: int
    gpus: tuple[str, ...]
    """More than one when tensor parallel: each gets the group's compute spans."""
    dc: str
    steps: tuple[Step, ...]
    pc: int = 0
    """Index of the next step, which is also its action's index."""
    iteration: int = 0
    done: bool = False
    waiting_since: float = 0.0
    prefill_started: float = 0.0
    prefill_until: float = 0.0
    resume_after_prefill: bool = False
    completed_sends: set[SendKey] = field(default_factory=set)
    """Sends whose completion came before the step that waits for them."""
    awaiting_send: SendKey | None = None
    waits_for_sends: bool = field(init=False)
    """Whether its steps wait on sends: only then are completions tracked."""

    def __post_init__(self) -> None:
        self.waits_for_sends = any(isinstance(step, SendWait) for step in self.steps)

    @property
    def lead(self) -> str:
        """The GPU that sends and receives for the group."""
        return self.gpus[0]

    def record(
        self,
        spans: list[Span],
        kind: SpanKind,
        start: float,
        end: float,
        microbatch: int | None = None,
        /,
        **detail: Unpack[SpanDetail],
    ) -> None:
        """The same span on every GPU of the group, in this iteration."""
        for gpu in self.gpus:
            spans.append({"gpu": gpu, "kind": kind, "start": start, "end": end,
                          "iteration": self.iteration, "stage": self.stage,
                          "microbatch": microbatch, **detail})
