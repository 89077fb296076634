"""A stage's backward split in two, as torch's zero-bubble schedules split it (what
torch.distributed.pipelining's stage_backward_input and stage_backward_weight do): first
the gradient of the stage's input, which the previous stage waits for, then, later, the
gradients of its weights, added into their .grad as a whole backward adds them.

The input pass runs autograd from the output to the input alone and keeps the graph. On
the way it catches the gradient arriving at each node where a weight's branch joins the
input's path (a linear layer's matmul, a norm): what the weights' gradients start from.
The weight pass starts autograd at those nodes with what was caught and goes to the
weights alone, so it redoes none of the input pass's work; the nodes between the output
and the joins are let go once the input pass is done.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import GradientEdge, Node, get_gradient_edge

Grads = tuple[torch.Tensor | None, ...]


@dataclass
class WeightGroup:
    """Weights whose branches join the input's path at the same nodes."""

    weights: list[torch.nn.Parameter]
    joins: list[Node]
    caught: dict[Node, Grads] = field(default_factory=dict)
    """The gradient each join received in the input pass."""


@dataclass
class ForWeights:
    """What the input pass leaves the weight pass."""

    groups: list[WeightGroup]


def input_gradient(output: torch.Tensor, output_grad: torch.Tensor | None,
                   stage_input: torch.Tensor, weights: Iterable[torch.nn.Parameter]
                   ) -> tuple[torch.Tensor, ForWeights]:
    """The gradient of `stage_input` (a leaf that requires it) from `output` (a scalar
    loss when `output_grad` is None), keeping what the weights' gradients need."""
    consumers = _consumers(output)
    on_path = _consuming(get_gradient_edge(stage_input).node, consumers)
    groups = _groups([w for w in weights if w.requires_grad], consumers, on_path)
    del consumers  # held, it would keep every node of the graph alive
    handles = [join.register_prehook(_catcher(group, join))
               for group in groups for join in group.joins]
    try:
        (grad,) = torch.autograd.grad(output, stage_input, output_grad, retain_graph=True)
    finally:
        for handle in handles:
            handle.remove()
    output.detach_()  # the nodes above the joins: no longer needed
    return grad, ForWeights(groups)


def weight_gradients(held: ForWeights) -> None:
    """Add the weights' gradients into their .grad, from what the input pass caught."""
    for group in held.groups:
        roots: list[GradientEdge] = []
        grads: list[torch.Tensor] = []
        for join in group.joins:
            for index, grad in enumerate(group.caught.get(join, ())):
                if grad is not None:
                    roots.append(GradientEdge(join, index))
                    grads.append(grad)
        if not roots:
            continue  # nothing reached these weights: their gradient is zero, as in a B
        handles = []
        if len(group.joins) > 1:  # a join below another gets its own caught gradient,
            handles = [join.register_prehook(_replacer(group.caught.get(join, ())))
                       for join in group.joins]  # not that plus what flows from above
        try:
            found = torch.autograd.grad(roots, [get_gradient_edge(w) for w in group.weights],
                                        grads, allow_unused=True)
        finally:
            for handle in handles:
                handle.remove()
        for weight, grad in zip(group.weights, found, strict=True):
            if grad is None:
                continue
            if weight.grad is None:
                weight.grad = grad
            else:
                weight.grad += grad
        group.caught.clear()


def _consumers(output: torch.Tensor) -> dict[Node, list[Node]]:
    """Every node of `output`'s graph, with the nodes that pass gradients to it."""
    root = output.grad_fn
    if root is None:
        raise ValueError("the stage's output has no graph")
    consumers: dict[Node, list[Node]] = collections.defaultdict(list)
    queue, seen = collections.deque([root]), {root}
    while queue:
        node = queue.popleft()
        for child, _ in node.next_functions:
            if child is None:
                continue
            consumers[child].append(node)
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return consumers


def _consuming(node: Node, consumers: dict[Node, list[Node]]) -> set[Node]:
    """`node` and every node its gradient comes through: the input's path."""
    found, queue = {node}, collections.deque([node])
    while queue:
        for consumer in consumers.get(queue.popleft(), ()):
            if consumer not in found:
                found.add(consumer)
                queue.append(consumer)
    return found


def _groups(weights: Sequence[torch.nn.Parameter], consumers: dict[Node, list[Node]],
            on_path: set[Node]) -> list[WeightGroup]:
    """The weights by the nodes where their branches join the input's path; weights that
    share one are in one group (a linear layer's weight and bias)."""
    group_of: dict[Node, WeightGroup] = {}
    for weight in weights:
        start = get_gradient_edge(weight).node
        if start not in consumers:
            continue  # not used in this forward
        joins: dict[Node, None] = {}  # in the order found: the same every run
        seen, queue = {start}, collections.deque([start])
        while queue:
            for consumer in consumers[queue.popleft()]:
                if consumer in on_path:
                    joins[consumer] = None
                elif consumer not in seen:
                    seen.add(consumer)
                    queue.append(consumer)
        group = WeightGroup([weight], list(joins))
        for other in {id(group_of[j]): group_of[j] for j in joins if j in group_of}.values():
            group.weights = other.weights + group.weights
            group.joins = list(dict.fromkeys(other.joins + group.joins))
        for join in group.joins:
            group_of[join] = group
    return list({id(g): g for g in group_of.values()}.values())


def _catcher(group: WeightGroup, join: Node) -> Any:
    def catch(grads: Grads) -> None:
        group.caught[join] = grads
    return catch


def _replacer(grads: Grads) -> Any:
    def replace(_arrived: Grads) -> Grads:
        return grads
    return replace
