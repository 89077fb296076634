"""What a real-compute stage keeps for syncs beyond every-step data parallelism: outer
parameters and an outer optimizer per fragment (DiLoCo, Streaming DiLoCo), the averaged
deltas waiting for their outer step, and the error-feedback residual of each compressed
gradient collective (EF-SGD, Karimireddy et al. 2019; Stich et al. 2018 for top-k).

Deltas are outer minus local parameters when a collective joins; OUTER_STEP gives their
average to the fragment's torch.optim.SGD as the outer parameters' gradient, then the
local parameters become mixing * local + (1 - mixing) * outer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from testbed.plan.collective import Collective, Reduces, topk_fraction
from testbed.plan.model import OuterOptimizer
from testbed.runtime.worker.allreduce import Contribution
from testbed.runtime.worker.payloads import Dense, Sparse, compressed, lossy

Fragment = tuple[int, int]
"""(fragment, fragments)."""
Named = list[tuple[str, torch.nn.Parameter]]


class Syncs:
    def __init__(self, named: Named, fragments_of: Callable[[int], dict[str, int]],
                 outer: OuterOptimizer | None, collectives: list[Collective],
                 replicas: int) -> None:
        """`named`: the stage's parameters in order; `fragments_of(n)`: each one's
        fragment of n; `collectives`: every collective the stage joins; `replicas`: of
        the stage, all of them."""
        self.named, self.config, self.replicas = named, outer or OuterOptimizer(), replicas
        self.members: dict[Fragment, Named] = {}
        self.outer: dict[str, torch.Tensor] = {}
        self.optimizers: dict[Fragment, torch.optim.SGD] = {}
        self.residuals: dict[Collective, torch.Tensor] = {}
        self.averaged: dict[Fragment, torch.Tensor] = {}
        for c in collectives:
            key = (c.fragment, c.fragments)
            if c.reduces is not Reduces.DELTAS or key in self.members:
                continue
            if not self.outer:  # outer parameters start as the initial ones
                self.outer = {n: p.detach().clone() for n, p in named}
            of = fragments_of(c.fragments)
            self.members[key] = [(n, p) for n, p in named if of[n] == c.fragment]
            params = [self.outer[n] for n, _ in self.members[key]]
            if params:
                momentum = self.config.momentum
                self.optimizers[key] = torch.optim.SGD(
                    params, lr=self.config.lr, momentum=momentum,
                    nesterov=self.config.nesterov and momentum > 0)

    def contribute(self, collective: Collective, members: int) -> Contribution:
        if collective.reduces is Reduces.GRADIENTS:
            values = torch.cat([_grad(p).reshape(-1) for _, p in self.named])
            if lossy(collective.payload) and members > 1:  # error feedback
                residual = self.residuals.get(collective)
                if residual is not None:
                    values = values + residual
                self.residuals[collective] = values - compressed(values, collective.payload)
        else:
            pairs = self.members[(collective.fragment, collective.fragments)]
            values = torch.cat([(self.outer[n] - p.detach()).reshape(-1) for n, p in pairs]) \
                if pairs else torch.zeros(0)
        values = values.to(torch.float32).cpu()
        fraction = topk_fraction(collective.payload)
        if fraction is not None and members > 1:
            return Sparse(values, fraction)
        return Dense(values, members, collective.payload)

    def reduced(self, collective: Collective, contribution: Contribution,
                members: int) -> None:
        assert isinstance(contribution, Dense | Sparse)
        average = contribution.values / members
        if collective.reduces is Reduces.DELTAS:
            if members == self.replicas:  # an outer step takes an average over all
                self.averaged[(collective.fragment, collective.fragments)] = average
            return
        offset = 0
        for _, p in self.named:
            n = p.numel()
            p.grad = average[offset : offset + n].view_as(p).to(p.device).clone()
            offset += n

    def outer_step(self, collective: Collective) -> None:
        key = (collective.fragment, collective.fragments)
        average = self.averaged.pop(key)
        optimizer = self.optimizers.get(key)
        if optimizer is None:  # this stage holds nothing of the fragment
            return
        offset = 0
        pairs = self.members[key]
        for name, p in pairs:
            outer = self.outer[name]
            outer.grad = average[offset : offset + p.numel()].view_as(outer).to(outer.device)
            offset += p.numel()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mixing = self.config.mixing
        with torch.no_grad():
            for name, p in pairs:
                p.copy_(mixing * p + (1 - mixing) * self.outer[name])

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to go on as this one would have."""
        return {"outer": self.outer,
                "optimizers": {f"{k}/{n}": o.state_dict() for (k, n), o in self.optimizers.items()},
                "residuals": {str(c): r for c, r in self.residuals.items()},
                "averaged": {f"{k}/{n}": a for (k, n), a in self.averaged.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, value in state["outer"].items():
            self.outer[name].copy_(value)
        for (k, n), optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][f"{k}/{n}"])
        self.residuals = {Collective.parse(c): r for c, r in state["residuals"].items()}
        self.averaged = {_fragment(key): a for key, a in state["averaged"].items()}


def _fragment(text: str) -> Fragment:
    k, _, n = text.partition("/")
    return int(k), int(n)


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)
