"""Activations a GPU holds, read from its actions (so any schedule counts right, torch's
interleaved and zero-bubble ones included). Pure.

A microbatch's activations are held from its forward until its backward is complete: a
B, or the W of a split backward. An I releases nothing: the W after it needs what the
layers stored, and the output gradients I computed besides (the zero-bubble paper,
arXiv 2401.10241, puts the memory W needs at about what B needs).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from testbed.plan.model import Action, Op


def holdings(actions: Iterable[Action]) -> Iterator[dict[int, int]]:
    """Microbatches held per stage after each action that changes them."""
    held: dict[int, int] = {}
    for action in actions:
        changed = False
        for leaf in action.leaves:
            if leaf.op is Op.F:
                held[leaf.stage] = held.get(leaf.stage, 0) + 1
                changed = True
            elif leaf.op in (Op.B, Op.W):
                held[leaf.stage] = held.get(leaf.stage, 0) - 1
                changed = True
        if changed:
            yield dict(held)


def in_flight(actions: Iterable[Action]) -> dict[int, int]:
    """Per stage the actions compute: the most microbatches whose activations it holds at
    once."""
    most: dict[int, int] = {}
    for held in holdings(actions):
        for stage, count in held.items():
            most[stage] = max(most.get(stage, 0), count)
    return most


def peak_layers_held(actions: Iterable[Action], layers: Mapping[int, int]) -> int:
    """The most (microbatch, layer) activations held at once over all the stages of the
    actions (`layers`: per stage): what a GPU holding several stages needs at its worst
    moment. The sum over stages of microbatches held times layers moves by one stage's
    layers at each F, B or W: a running total, not a sum per action (a plan search checks
    thousands of orders)."""
    total, peak = 0, None
    for action in actions:
        changed = False
        for leaf in action.leaves:
            if leaf.op is Op.F:
                total += layers[leaf.stage]
                changed = True
            elif leaf.op is Op.B or leaf.op is Op.W:
                total -= layers[leaf.stage]
                changed = True
        if changed and (peak is None or total > peak):
            peak = total
    return 0 if peak is None else peak
