"""What a real-compute stage keeps for syncs beyond every-step data parallelism: outer
parameters and an outer optimizer per fragment (DiLoCo, Streaming DiLoCo), in host memory
as OpenDiLoCo (arXiv 2407.07852) keeps them, off the GPU; the averaged
deltas waiting for their outer step, and the error-feedback residual of each compressed
gradient collective (EF-SGD: Seide et al. 2014; Karimireddy et al. 2019, arXiv
1901.09847; Stich et al. 2018 for top-k). A member compresses its gradient plus its
residual once and keeps what that lost as its next residual; the collective gathers every
member's compressed payload (testbed.plan.collective.Collective.gathers), so that loss is
the only error in the sum and the residuals account for all of it.

Deltas are outer minus local parameters when a collective joins; OUTER_STEP gives their
average to the fragment's torch.optim.SGD as the outer parameters' gradient, then the
local parameters become mixing * local + (1 - mixing) * outer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from testbed.plan.collective import Collective, Reduces
from testbed.plan.model import OuterOptimizer
from testbed.runtime.worker.allreduce import Contribution
from testbed.runtime.worker.payloads import HOST, Dense, Gathered, decode, encode, lossy

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
            if not self.outer:  # outer parameters start as the initial ones, on the host
                self.outer = {n: p.detach().to(HOST, copy=True) for n, p in named}
            of = fragments_of(c.fragments)
            self.members[key] = [(n, p) for n, p in named if of[n] == c.fragment]
            params = [self.outer[n] for n, _ in self.members[key]]
            if params:
                momentum = self.config.momentum
                self.optimizers[key] = torch.optim.SGD(
                    params, lr=self.config.lr, momentum=momentum,
                    nesterov=self.config.nesterov and momentum > 0)

    def contribute(self, collective: Collective, members: int) -> Contribution:
        """This member's side of `collective`: its gradients (plus the residual its error
        feedback kept) or its deltas. A gathered payload is compressed once, here, on
        the parameters' device; what that lost is the next residual."""
        if collective.reduces is Reduces.GRADIENTS:
            values = torch.cat([_grad(p).reshape(-1) for _, p in self.named])
            residual = self.residuals.get(collective)
            if residual is not None and members > 1:
                values = values + residual
        else:
            pairs = self.members[(collective.fragment, collective.fragments)]
            values = torch.cat([(self.outer[n] - p.detach().to(HOST)).reshape(-1)
                                for n, p in pairs]) if pairs else torch.zeros(0)
        values = values.to(torch.float32)
        if collective.gathers and members > 1:
            mine = encode(values, collective.payload)
            if collective.reduces is Reduces.GRADIENTS and lossy(collective.payload):
                sent = decode(mine, values.numel(), collective.payload, values.device)
                self.residuals[collective] = values - sent
            return Gathered(mine, values.numel(), collective.payload)
        return Dense(values.cpu(), members, collective.payload)

    def reduced(self, collective: Collective, contribution: Contribution,
                members: int) -> None:
        assert isinstance(contribution, Dense | Gathered) and contribution.values is not None
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
            outer.grad = average[offset : offset + p.numel()].view_as(outer)
            offset += p.numel()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mixing = self.config.mixing
        with torch.no_grad():
            for name, p in pairs:
                p.copy_(mixing * p + (1 - mixing) * self.outer[name].to(p.device))

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
