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
local parameters become mixing * local + (1 - mixing) * outer. An eager outer step
(Kale, Douillard, Donchev, arXiv 2502.12996, Algorithm 3) gives it instead, at once,
(this replica's fresh deltas + the sum of the other replicas' deltas of the sync before)
/ M, the latter being the previous average less this replica's own previous deltas as
it sent them: previous - sent / M + fresh / M, in that order, in fp32 (nothing the first
time); the local parameters then take the outer ones.

A collective in buckets (testbed.plan.buckets) covers its values in the order the
backward produces them (testbed.emulator.runtime.worker.compute.model.backward_order); a
whole one, in the stage's own order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from testbed.emulator.runtime.worker.collectives.allreduce import Contribution
from testbed.emulator.runtime.worker.collectives.payloads import (
    HOST,
    Dense,
    Gathered,
    compressed,
    decode,
    encode,
    lossy,
)
from testbed.plan.collective import Collective, Reduces, bucket_range
from testbed.plan.model import OuterOptimizer

Fragment = tuple[int, int]
"""(fragment, fragments)."""
Named = list[tuple[str, torch.nn.Parameter]]
Piece = tuple[str, torch.nn.Parameter, int, int]
"""A parameter's values [start, end) of its flat view that a bucket holds."""


class Syncs:
    def __init__(self, named: Named, fragments_of: Callable[[int], dict[str, int]],
                 outer: OuterOptimizer | None, collectives: list[Collective],
                 replicas: int, backward: list[str] | None = None) -> None:
        """`named`: the stage's parameters in order; `fragments_of(n)`: each one's
        fragment of n; `collectives`: every collective the stage joins; `replicas`: of
        the stage, all of them; `backward`: their names in the order the backward
        produces their gradients (for collectives in buckets)."""
        self.named, self.config, self.replicas = named, outer or OuterOptimizer(), replicas
        order = {name: i for i, name in enumerate(backward or [n for n, _ in named])}
        self.members: dict[Fragment, Named] = {}
        self.layouts: dict[tuple[Reduces, Fragment], Named] = {}
        self.outer: dict[str, torch.Tensor] = {}
        self.optimizers: dict[Fragment, torch.optim.SGD] = {}
        self.residuals: dict[Collective, torch.Tensor] = {}
        self.averaged: dict[Fragment, torch.Tensor] = {}
        self.partial: dict[Fragment, dict[int, torch.Tensor]] = {}
        """Averaged deltas of a fragment's buckets until every bucket's is in."""
        self.fresh: dict[Fragment, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
        """Eager: this replica's deltas of the sync under way, by bucket, and as sent."""
        self.sent: dict[Fragment, torch.Tensor] = {}
        """Eager: this replica's deltas of the sync before, as sent."""
        self._pieces: dict[Collective, list[Piece]] = {}
        for c in collectives:
            key = (c.fragment, c.fragments)
            layout = (c.reduces, key)
            if c.bucketed or layout not in self.layouts:
                chosen = named if c.reduces is Reduces.GRADIENTS else \
                    [(n, p) for n, p in named if fragments_of(c.fragments)[n] == c.fragment]
                self.layouts[layout] = sorted(chosen, key=lambda np: order[np[0]]) \
                    if c.bucketed else list(chosen)
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

    def pieces(self, collective: Collective) -> list[Piece]:
        """What of each parameter the collective's bucket holds, in its order."""
        found = self._pieces.get(collective)
        if found is None:
            layout = self.layouts[(collective.reduces,
                                   (collective.fragment, collective.fragments))]
            total = sum(p.numel() for _, p in layout)
            start, end = bucket_range(total, collective.bucket, collective.buckets)
            found, offset = [], 0
            for name, p in layout:
                lo, hi = max(start, offset), min(end, offset + p.numel())
                if lo < hi:
                    found.append((name, p, lo - offset, hi - offset))
                offset += p.numel()
            self._pieces[collective] = found
        return found

    def contribute(self, collective: Collective, members: int) -> Contribution:
        """This member's side of `collective`: its gradients (plus the residual its error
        feedback kept) or its deltas. A gathered payload is compressed once, here, on
        the parameters' device; what that lost is the next residual."""
        pieces = self.pieces(collective)
        if collective.reduces is Reduces.GRADIENTS:
            values = _cat([_grad(p).reshape(-1)[a:b] for _, p, a, b in pieces])
            residual = self.residuals.get(collective)
            if residual is not None and members > 1:
                values = values + residual
        else:
            values = _cat([(self.outer[n] - p.detach().to(HOST)).reshape(-1)[a:b]
                           for n, p, a, b in pieces])
        values = values.to(torch.float32)
        if collective.reduces is Reduces.DELTAS and self.config.eager:
            # a copy: a ring sums into the values it is given
            self.fresh.setdefault((collective.fragment, collective.fragments), {})[
                collective.bucket] = (values.to(HOST, copy=True),
                                      compressed(values, collective.payload).to(HOST))
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
                key = (collective.fragment, collective.fragments)
                parts = self.partial.setdefault(key, {})
                parts[collective.bucket] = average
                if len(parts) == collective.buckets:
                    self.averaged[key] = _cat([parts[b] for b in range(collective.buckets)])
                    del self.partial[key]
            return
        offset = 0
        for _, p, start, end in self.pieces(collective):
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            p.grad.view(-1)[start:end] = average[offset : offset + end - start].to(p.device)
            offset += end - start

    def outer_step(self, collective: Collective) -> None:
        key = (collective.fragment, collective.fragments)
        optimizer = self.optimizers.get(key)
        average = self._eager(key) if self.config.eager else self.averaged.pop(key)
        if optimizer is None:  # this stage holds nothing of the fragment
            return
        layout = self.layouts[(Reduces.DELTAS, key)]
        offset = 0
        for name, p in layout:
            outer = self.outer[name]
            outer.grad = average[offset : offset + p.numel()].view_as(outer)
            offset += p.numel()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        mixing = 0.0 if self.config.eager else self.config.mixing
        with torch.no_grad():
            for name, p in layout:
                p.copy_(mixing * p + (1 - mixing) * self.outer[name].to(p.device))

    def _eager(self, key: Fragment) -> torch.Tensor:
        """previous - sent / M + fresh / M (see the module's docstring)."""
        buckets = self.fresh.pop(key)
        fresh = _cat([buckets[b][0] for b in range(len(buckets))])
        sent = _cat([buckets[b][1] for b in range(len(buckets))])
        previous = self.averaged.pop(key, None)
        before = self.sent.get(key)
        self.sent[key] = sent
        if previous is None or before is None:
            return fresh / self.replicas
        return previous - before / self.replicas + fresh / self.replicas

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to go on as this one would have: tensors and
        torch optimizers' own state dicts, in torch's convention (torch.save keeps it)."""
        return {"outer": self.outer,
                "optimizers": {f"{k}/{n}": o.state_dict() for (k, n), o in self.optimizers.items()},
                "residuals": {str(c): r for c, r in self.residuals.items()},
                "averaged": {f"{k}/{n}": a for (k, n), a in self.averaged.items()},
                "sent": {f"{k}/{n}": a for (k, n), a in self.sent.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, value in state["outer"].items():
            self.outer[name].copy_(value)
        for (k, n), optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][f"{k}/{n}"])
        self.residuals = {Collective.parse(c): r for c, r in state["residuals"].items()}
        self.averaged = {_fragment(key): a for key, a in state["averaged"].items()}
        self.sent = {_fragment(key): a for key, a in state.get("sent", {}).items()}


def _fragment(text: str) -> Fragment:
    k, _, n = text.partition("/")
    return int(k), int(n)


def _cat(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts) if parts else torch.zeros(0)


def _grad(p: torch.nn.Parameter) -> torch.Tensor:
    return p.grad if p.grad is not None else torch.zeros_like(p)
