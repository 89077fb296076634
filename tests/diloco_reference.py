"""The DiLoCo family in one process, in plain torch: the oracle the workers' real compute
must equal. Written from the contract of plans that span iterations and from the papers,
not from the runtime's code: K replicas of the whole model, trained in turn on the samples
each replica's workers read, each with its own AdamW (the job's `optimizer`); syncs after
the inner step of the iterations that have them.

- Every-step gradients compressed with error feedback (int8, int4, top-k), as EF-SGD
  states it (Seide et al. 2014, 1-bit SGD; Karimireddy et al. 2019, arXiv 1901.09847,
  EF-SGD, with the gradient as what is compressed): each replica forms p = g + e from
  its gradient g and its residual e, sends C(p) once, and keeps e = p - C(p); every replica
  applies the mean of all replicas' C(p), summed in fp32 in replica order. C is the
  contract's: blockwise absmax with round to nearest even, or the k largest magnitudes.
- Uncompressed gradients and deltas (outer minus local parameters, when a sync starts)
  are summed as a ring does: chunk i of whole 256-element blocks starts at replica i and
  each replica after it adds its own, the sum crossing the wire in the payload at every
  hop; the replica that finishes a chunk sends it round as the others read it. Deltas
  keep no error feedback. An outer step hands their average to the fragment's
  torch.optim.SGD as the outer parameters' gradient; then local = mixing * local +
  (1 - mixing) * outer.

A compressed or ring-summed vector here is a whole replica's, as one pipeline stage holds
it: a pipeline's stages compress and chunk their own parts, so compare pipelined plans
only where that cannot matter (fp32 deltas in a ring of two, a + b being b + a).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from testbed.job.model import Job
from testbed.runtime.worker.model import Corpus, build_model, loss_of, sample_index

BLOCK = 256


@dataclass(frozen=True)
class Sync:
    """One thing replicas do after their inner step: `start` a sync of a fragment's deltas
    (they are taken now), or take its `outer` step."""

    kind: Literal["start", "outer"]
    fragment: int = 0
    fragments: int = 1
    payload: str = ""


@dataclass(frozen=True)
class Outer:
    lr: float = 0.7
    momentum: float = 0.9
    nesterov: bool = True
    mixing: float = 0.0


def fragment_of(name: str, layers: int, fragments: int) -> int:
    """Streaming DiLoCo's strided fragments: block i in fragment i mod N, the embeddings
    with block 0, the final norm and output layer with the last block."""
    if name.startswith("blocks."):
        return int(name.split(".")[1]) % fragments
    if name.startswith(("embed.", "position.")):
        return 0
    assert name.startswith("head."), name
    return (layers - 1) % fragments


def wire(values: torch.Tensor, payload: str) -> torch.Tensor:
    """`values` as the receiving end reads them."""
    if payload in ("", "fp32"):
        return values.clone()
    if payload in ("bf16", "fp16"):
        return values.to(torch.bfloat16 if payload == "bf16" else torch.float16).float()
    levels = {"int8": 127, "int4": 7}[payload]
    out = torch.empty_like(values)
    for start in range(0, values.numel(), BLOCK):
        block = values[start : start + BLOCK]
        scale = block.abs().max() / levels
        if scale == 0:
            out[start : start + BLOCK] = 0.0
        else:
            out[start : start + BLOCK] = torch.round(block / scale).clamp(-levels, levels) * scale
    return out


def top_k(values: torch.Tensor, percent: float) -> torch.Tensor:
    """The k = ceil(percent% of the elements) largest magnitudes, ties to the lower index;
    zeros elsewhere."""
    k = math.ceil(values.numel() * percent / 100)
    ranked = sorted(range(values.numel()), key=lambda i: (-abs(float(values[i])), i))
    out = torch.zeros_like(values)
    kept = torch.tensor(ranked[:k], dtype=torch.long)
    out[kept] = values[kept]
    return out


def compress(values: torch.Tensor, payload: str) -> torch.Tensor:
    """C: what a compressed gradient payload delivers of `values`."""
    if payload.startswith("top") and payload.endswith("%"):
        return top_k(values, float(payload[3:-1]))
    return wire(values, payload)


def error_feedback_average(gradients: Sequence[torch.Tensor], residuals: list[torch.Tensor],
                           payload: str) -> torch.Tensor:
    """EF-SGD's step for every replica at once: each replica r sends C(g_r + e_r) and
    keeps e_r = g_r + e_r - C(g_r + e_r) (`residuals`, updated in place); the mean of what
    was sent."""
    total = torch.zeros_like(gradients[0])
    for r, g in enumerate(gradients):
        p = g + residuals[r] if residuals[r].numel() else g
        sent = compress(p, payload)
        residuals[r] = p - sent
        total += sent
    return total / len(gradients)


def ring_sum(values: Sequence[torch.Tensor], payload: str) -> torch.Tensor:
    n = len(values)
    if n == 1:
        return values[0].clone()
    blocks = values[0].numel() // BLOCK
    sizes = [(blocks // n + (1 if i < blocks % n else 0)) * BLOCK for i in range(n)]
    sizes[-1] += values[0].numel() - sum(sizes)
    out = torch.empty_like(values[0])
    start = 0
    for i, size in enumerate(sizes):
        end = start + size
        partial = values[i][start:end]
        for hop in range(1, n):
            partial = values[(i + hop) % n][start:end] + wire(partial, payload)
        out[start:end] = wire(partial, payload)
        start = end
    return out


def train(job: Job, replicas: int, microbatches: int, iterations: int,
          syncs: Callable[[int], list[Sync]], outer: Outer = Outer(),
          gradients: str | None = None,
          kept: dict[int, dict[str, torch.Tensor]] | None = None
          ) -> list[dict[str, torch.Tensor]]:
    """Each replica's parameters after `iterations`; `gradients`: the payload of an
    every-step gradient all-reduce (None: replicas step apart); `kept`: its keys are
    iterations at whose start (`iterations`: at the end) to keep the outer parameters
    there."""
    torch.set_num_threads(1)
    shape = job.model
    models = [build_model(shape, job.seed) for _ in range(replicas)]
    settings = job.optimizer
    inner = [torch.optim.AdamW(m.parameters(), lr=settings.lr,
                               weight_decay=settings.weight_decay) for m in models]
    corpus = Corpus(shape.vocab, shape.seq_len, job.seed)
    outer_loop = _OuterLoop(models, shape.layers, outer)
    residuals = [torch.zeros(0) for _ in range(replicas)]
    for iteration in range(iterations):
        if kept is not None and iteration in kept:
            kept[iteration] = outer_loop.snapshot()
        for r, model in enumerate(models):
            for mb in range(microbatches):
                first = sample_index(iteration, r, mb, replicas, microbatches,
                                     job.microbatch_size)
                inputs, targets = corpus.batch(first, job.microbatch_size)
                (loss_of(model(inputs), targets) / microbatches).backward()  # type: ignore[no-untyped-call]
        if gradients is not None:
            _all_reduce_gradients(models, residuals, gradients)
        for optimizer in inner:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for sync in syncs(iteration):
            outer_loop.apply(sync)
    if kept is not None and iterations in kept:
        kept[iterations] = outer_loop.snapshot()
    assert not math.isnan(sum(float(p.detach().sum()) for m in models for p in m.parameters()))
    return [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]


def _all_reduce_gradients(models: list[torch.nn.Module], residuals: list[torch.Tensor],
                          payload: str) -> None:
    """Every replica's gradients replaced by their average: ring-summed as sent
    uncompressed, or compressed with error feedback."""
    flats = [torch.cat([p.grad.reshape(-1) for p in m.parameters()])  # type: ignore[union-attr]
             for m in models]
    if payload in ("", "fp32", "bf16", "fp16"):
        average = ring_sum(flats, payload) / len(models)
    else:
        average = error_feedback_average(flats, residuals, payload)
    for m in models:
        offset = 0
        for p in m.parameters():
            p.grad = average[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()


class _OuterLoop:
    """The outer parameters, a torch SGD per fragment, and the averaged deltas of the
    syncs started and not yet stepped."""

    def __init__(self, models: list[torch.nn.Module], layers: int, outer: Outer) -> None:
        self.models, self.layers, self.outer = models, layers, outer
        self.names = [n for n, _ in models[0].named_parameters()]
        self.params = {n: p.detach().clone() for n, p in models[0].named_parameters()}
        self.optimizers: dict[tuple[int, int], torch.optim.SGD] = {}
        self.pending: dict[tuple[int, int], torch.Tensor] = {}

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {n: p.clone() for n, p in self.params.items()}

    def apply(self, sync: Sync) -> None:
        key = (sync.fragment, sync.fragments)
        chosen = [n for n in self.names
                  if fragment_of(n, self.layers, sync.fragments) == sync.fragment]
        if sync.kind == "start":
            deltas = [torch.cat([(self.params[n] - dict(m.named_parameters())[n].detach())
                                 .reshape(-1) for n in chosen]) for m in self.models]
            self.pending[key] = ring_sum(deltas, sync.payload) / len(self.models)
        else:
            self._step(key, chosen)

    def _step(self, key: tuple[int, int], chosen: list[str]) -> None:
        """The fragment's outer step on its averaged deltas, then every replica's copy
        mixed towards the new outer parameters."""
        outer = self.outer
        if key not in self.optimizers:
            self.optimizers[key] = torch.optim.SGD(
                [self.params[n] for n in chosen], lr=outer.lr, momentum=outer.momentum,
                nesterov=outer.nesterov)
        average = self.pending.pop(key)
        offset = 0
        for n in chosen:
            count = self.params[n].numel()
            self.params[n].grad = average[offset : offset + count].view_as(self.params[n])
            offset += count
        self.optimizers[key].step()
        self.optimizers[key].zero_grad(set_to_none=True)
        with torch.no_grad():
            for m in self.models:
                params = dict(m.named_parameters())
                for n in chosen:
                    params[n].copy_(outer.mixing * params[n]
                                    + (1 - outer.mixing) * self.params[n])
