"""Plans whose iterations differ: a cycle of programs made from one iteration's actions and
what each stage does besides them in each iteration of the cycle (DiLoCo's sync every H
steps, Streaming DiLoCo's fragments in turn), and an opening cycle where the first one
differs (a sync that crosses the cycle's end has nothing to wait for in the run's first)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from testbed.plan.model import Action, Op, OuterOptimizer, Plan


@dataclass(frozen=True)
class Iteration:
    """What a stage does in one iteration of a cycle besides its inner step."""

    before: tuple[Action, ...] = ()
    """Before its first action (waiting for a sync started in an earlier iteration, which
    must end before the same collective starts again)."""
    in_backward: tuple[Action, ...] = ()
    """Right after its last backward: a START there starts as that backward has its
    values (testbed.plan.buckets), a delta's once its parameters took their inner step in
    the backward (testbed.plan.interpret.ReduceStart)."""
    after: tuple[Action, ...] = ()
    """After its step."""


Tail = Callable[[int], "Sequence[Action] | Iteration"]
"""What a stage (given) does in one iteration of a cycle: actions after its step, or an
Iteration placing them."""


def cycled(plan: Plan, tails: Sequence[Tail], outer: OuterOptimizer | None = None,
           opening: Sequence[Tail] | None = None) -> Plan:
    """`plan` as a cycle of len(tails) iterations: iteration i runs every GPU's actions
    with what tails[i] adds for each stage it holds (a sync every H steps: H - 1 empty
    tails, then the sync). `opening`: the tails of the run's first cycle where they differ
    from `tails` (as many). Iterations that run the same actions share one program."""
    if not tails:
        raise ValueError("a cycle needs at least one iteration")
    if opening is not None and len(opening) != len(tails):
        raise ValueError(f"the opening cycle has {len(opening)} iterations, the cycle "
                         f"{len(tails)}")
    programs: dict[tuple[Iteration, ...], int] = {}
    bodies: list[dict[str, tuple[Action, ...]]] = []

    def program(tail: Tail) -> int:
        key = tuple(_iteration(tail(stage)) for stage in range(plan.pp))
        if key not in programs:
            programs[key] = len(bodies)
            bodies.append({gpu: _with(actions, plan.stages_of(gpu), key)
                           for gpu, actions in plan.actions.items()})
        return programs[key]

    cycle = tuple(program(tail) for tail in tails)
    first = tuple(program(tail) for tail in opening) if opening is not None else ()
    return replace(plan, actions=bodies[0], programs=tuple(bodies[1:]),
                   cycle=cycle if len(bodies) > 1 else (),
                   opening=first if first != cycle else (),
                   outer=outer or plan.outer)


def _iteration(made: Sequence[Action] | Iteration) -> Iteration:
    return made if isinstance(made, Iteration) else Iteration(after=tuple(made))


def _with(actions: tuple[Action, ...], stages: tuple[int, ...],
          key: tuple[Iteration, ...]) -> tuple[Action, ...]:
    """A GPU's actions with what each stage it holds does besides them."""
    out = list(actions)
    for stage in stages:
        extra = key[stage]
        if extra.in_backward:
            last = max(i for i, a in enumerate(out) if any(
                leaf.stage == stage and leaf.op in (Op.B, Op.W) for leaf in a.leaves))
            while last + 1 < len(out) and out[last + 1].op.is_send:  # sends do not block
                last += 1
            out[last + 1 : last + 1] = extra.in_backward
    before = [a for stage in stages for a in key[stage].before]
    after = [a for stage in stages for a in key[stage].after]
    return (*before, *out, *after)
