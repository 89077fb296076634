"""A GPU (or tensor-parallel group) of one replica as the simulator runs it: the stage it
holds, or the several it holds under virtual stages, its interpreted steps per program of
the plan (one list for all its stages: a GPU computes one thing at a time), and where it is
in them; the transfers, all-reduces and prefills modules all move it along."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Unpack

from testbed.common.span_table import SpanTable
from testbed.common.spans import SpanDetail, SpanKind
from testbed.plan.collective import Collective
from testbed.plan.interpret import Phase, SendWait, Step, interpret
from testbed.plan.model import Action
from testbed.scenario.slowdowns import Slowdown

SendKey = tuple[int, Phase, int, int]
"""(iteration, phase, receiving stage, microbatch) of one of a worker's sends (a GPU
holding two stages may send the same microbatch's activations from both)."""


@dataclass
class SimWorker:
    index: int
    replica: int
    stage: int
    """Its first stage: what it records where a span belongs to no one stage (a prefill)."""
    gpus: tuple[str, ...]
    """More than one when tensor parallel: each gets the group's compute spans."""
    dc: str
    programs: tuple[tuple[Step, ...], ...]
    """Its steps in each of the plan's programs (Plan.all_programs)."""
    program_of: Callable[[int], int] = field(default=lambda _iteration: 0, repr=False)
    """The program an iteration runs (Plan.program_of)."""
    steps: tuple[Step, ...] = field(init=False)
    """The steps of the iteration under way."""
    program: int = field(init=False)
    """Which program that iteration runs."""
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
    under_way: dict[tuple[int, Collective], Joined] = field(default_factory=dict)
    """All-reduces it started (ALLREDUCE_START) and has not yet waited for, by stage and
    collective."""
    early: dict[tuple[int, int], bool] = field(default_factory=dict)
    """STARTs in a backward (iteration, step index) that joined during it, as the
    backward had their values: the worker passes them by when it gets there."""
    stages: tuple[int, ...] = ()
    """Every stage it holds (virtual stages), in order; `(stage,)` when left out."""
    slowdowns: list[Slowdown] = field(default_factory=list)
    """When it computes slower (a scenario's stragglers): each compute that starts in a
    window takes its factor times as long."""
    lead: str = field(init=False)
    """The GPU that sends and receives for the group."""
    alone: tuple[str, ...] = field(init=False)
    """The lead GPU alone: where a message's spans go."""

    def __post_init__(self) -> None:
        self.stages = self.stages or (self.stage,)
        self.lead, self.alone = self.gpus[0], self.gpus[:1]
        self.waits_for_sends = any(isinstance(step, SendWait) for steps in self.programs
                                   for step in steps)
        self.begin(self.iteration)

    def begin(self, iteration: int) -> None:
        """Start `iteration` at its first step, in the program the plan gives it (each
        worker switches at its own iteration boundary: there is no barrier between
        iterations)."""
        self.iteration, self.pc = iteration, 0
        self.program = self.program_of(iteration)
        self.steps = self.programs[self.program]

    def record(
        self,
        spans: SpanTable,
        kind: SpanKind,
        start: float,
        end: float,
        microbatch: int | None = None,
        /,
        *,
        iteration: int | None = None,
        **detail: Unpack[SpanDetail],
    ) -> None:
        """The same span on every GPU of the group (one row), in `iteration` (default:
        the one under way), of the stage `detail` names (default: its first)."""
        spans.add(self.gpus, kind, start, end, self.iteration if iteration is None else iteration,
                  {"stage": self.stage, "microbatch": microbatch, **detail})


Resume = Callable[[SimWorker, float], None]
"""What carries on with a worker's steps once what it waited for is done."""


@dataclass
class Joined:
    """A worker's part in one all-reduce."""

    worker: SimWorker
    at: float
    """When it joined."""
    iteration: int
    action: int | None
    """The index of the ALLREDUCE it waits at; None when it went on (ALLREDUCE_START)."""
    stage: int
    """Whose gradients or deltas: a GPU holding several stages reduces each apart."""
    done: bool = False
    resume: Resume | None = None
    """While the worker waits for the result: what carries on once it is in."""


def interpreted(known: dict[tuple[int, tuple[int, ...]], tuple[Step, ...]],
                 actions: tuple[Action, ...], stages: tuple[int, ...], pp: int
                 ) -> tuple[Step, ...]:
    """A worker's interpreted steps, made once per action list and stages held (steps are
    immutable)."""
    key = (id(actions), stages)
    if key not in known:
        known[key] = interpret(actions, stages, pp)
    return known[key]
