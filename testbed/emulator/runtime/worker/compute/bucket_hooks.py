"""All-reduces that start in a backward (testbed.plan.interpret.ReduceStart), as real
compute runs them: torch's DistributedDataParallel way, a hook on every parameter a
bucket holds fires once its gradient is accumulated (`register_post_accumulate_grad_hook`)
and the bucket starts when all of them have. Buckets start in the plan's order, each once
those before it have: every member of a ring joins its collectives in the same order.

A bucket of deltas first needs its parameters' inner step: each takes it in its hook,
alone, as soon as its gradient is final (the optimizer in the backward, as torch's
documentation shows it), and leaves no gradient for the stage's STEP to apply again.
Gradients a backward never reaches (an unused parameter, or a split backward's weight
half, which adds into .grad without autograd's accumulation) are taken at its end.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from testbed.emulator.runtime.worker.collectives.in_backward import InBackward
from testbed.emulator.runtime.worker.collectives.syncs import Syncs
from testbed.plan.collective import Reduces


def step_only(optimizer: torch.optim.Optimizer, params: Sequence[torch.nn.Parameter]) -> None:
    """The optimizer's step on `params` alone, with its own state and settings."""
    chosen = {id(p) for p in params}
    kept = [group["params"] for group in optimizer.param_groups]
    try:
        for group in optimizer.param_groups:
            group["params"] = [p for p in group["params"] if id(p) in chosen]
        optimizer.step()
    finally:
        for group, params_of in zip(optimizer.param_groups, kept, strict=True):
            group["params"] = params_of


@dataclass
class BackwardBuckets:
    """The hooks of one backward: enter before it, leave after it."""

    syncs: Syncs
    optimizer: torch.optim.Optimizer
    starts: Sequence[InBackward]
    done: set[int] = field(default_factory=set)
    """Parameters (by id) whose gradient is final (and, for deltas, stepped)."""
    next: int = 0
    """The first bucket not started yet."""
    handles: list[Any] = field(default_factory=list)
    needs: list[set[int]] = field(default_factory=list)
    stepping: dict[int, torch.nn.Parameter] = field(default_factory=dict)
    """Parameters (by id) that take their inner step in the backward."""

    def __enter__(self) -> BackwardBuckets:
        seen: dict[int, torch.nn.Parameter] = {}
        for start in self.starts:
            params = {id(p): p for _, p, _, _ in self.syncs.pieces(start.collective)}
            self.needs.append(set(params))
            seen.update(params)
            if start.collective.reduces is Reduces.DELTAS:
                self.stepping.update(params)
        self.handles = [p.register_post_accumulate_grad_hook(  # type: ignore[no-untyped-call]
            self._final) for p in seen.values()]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self.handles:
            handle.remove()
        if exc[0] is not None:
            return
        for pid, p in self.stepping.items():  # reached by no hook
            if pid not in self.done:
                self._take(p)
        self.done |= {pid for need in self.needs for pid in need}
        self._start_ready()

    def _final(self, p: torch.Tensor) -> None:
        assert isinstance(p, torch.nn.Parameter)
        if id(p) in self.stepping:
            self._take(p)
        self.done.add(id(p))
        self._start_ready()

    def _take(self, p: torch.nn.Parameter) -> None:
        """The parameter's inner step, now; nothing left for the STEP to apply."""
        if p.grad is not None:
            step_only(self.optimizer, [p])
            p.grad = None
        self.done.add(id(p))

    def _start_ready(self) -> None:
        while self.next < len(self.starts) and self.needs[self.next] <= self.done:
            start = self.starts[self.next]
            start.started(self.syncs.contribute(start.collective, start.members))
            self.next += 1
