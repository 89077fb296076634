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
- Deltas in a quantized payload (int8, int4, and the Streaming DiLoCo paper's 4-bit float,
  E3M0) are quantized once by each replica and summed in fp32 after dequantizing, in
  replica order: the paper lowers the precision of what is communicated only (arXiv
  2501.18512, section 2.3). E3M0 here: a sign and 2^(e - 7), e = 1..7, times the block's
  absmax (256 values a block), or 0; the nearest value, a tie to the larger magnitude.
- Uncompressed gradients and deltas (outer minus local parameters, when a sync starts)
  are summed as a ring does: chunk i of whole 256-element blocks starts at replica i and
  each replica after it adds its own, the sum crossing the wire in the payload at every
  hop; the replica that finishes a chunk sends it round as the others read it. Deltas
  keep no error feedback. An outer step hands their average to the fragment's
  torch.optim.SGD as the outer parameters' gradient; then local = mixing * local +
  (1 - mixing) * outer.
- In buckets (torch DDP's, and the plan's `bK/N`): the values laid out in the order the
  backward produces them (the output layer, the blocks last to first, the embeddings;
  a unit's own parameters last to first), bucket k of N the k-th N-th of them, each
  bucket reduced on its own (its own ring). A bucket of deltas that starts in the
  backward takes its parameters' inner step there: the same step, so the same values.
- Eager outer steps (Kale, Douillard, Donchev 2025, arXiv 2502.12996, Algorithm 3): each
  replica keeps its own outer parameters and momentum; at a sync it applies at once
  (its fresh deltas + the sum of the others' deltas of the previous sync, as each sent
  them) / M, computed as previous average - own previous as sent / M + fresh / M (the
  first sync: fresh / M), and its local parameters take its outer ones; the sync's own
  average is what the next one mixes in.

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

from testbed.emulator.runtime.worker.compute.model import Corpus, build_model, loss_of, sample_index
from testbed.job.model import Job

BLOCK = 256
QUANTIZED = ("int8", "int4", "fp4")


@dataclass(frozen=True)
class Sync:
    """One thing replicas do after their inner step: `start` a sync of a fragment's deltas
    (they are taken now), or take its `outer` step."""

    kind: Literal["start", "outer"]
    fragment: int = 0
    fragments: int = 1
    payload: str = ""
    buckets: int = 1


@dataclass(frozen=True)
class Outer:
    lr: float = 0.7
    momentum: float = 0.9
    nesterov: bool = True
    mixing: float = 0.0
    eager: bool = False


def fragment_of(name: str, layers: int, fragments: int) -> int:
    """Streaming DiLoCo's strided fragments: block i in fragment i mod N, the embeddings
    with block 0, the final norm and output layer with the last block."""
    if name.startswith("blocks."):
        return int(name.split(".")[1]) % fragments
    if name.startswith(("embed.", "position.")):
        return 0
    assert name.startswith("head."), name
    return (layers - 1) % fragments


def backward_order(names: Sequence[str]) -> list[str]:
    """The output layer's parameters, then each block's from the last block to the
    first, then the embeddings'; within each, last to first."""
    def unit(name: str) -> tuple[int, int]:
        if name.startswith("head."):
            return (0, 0)
        if name.startswith("blocks."):
            return (1, -int(name.split(".")[1]))
        return (2, 0)

    return sorted(names, key=lambda n: (unit(n), -names.index(n)))


def fp4(block: torch.Tensor) -> torch.Tensor:
    """One block as E3M0 delivers it: |x| / scale in fp32 takes the level above each
    midpoint between two levels it reaches (a tie goes up)."""
    scale = block.abs().max()
    if scale == 0:
        return torch.zeros_like(block)
    levels = torch.tensor([0.0] + [2.0 ** (e - 7) for e in range(1, 8)])
    midpoints = (levels[:-1] + levels[1:]) / 2
    ratios = block.abs() / scale
    chosen = levels[(ratios[:, None] >= midpoints[None, :]).sum(dim=1)]
    return torch.where(block < 0, -chosen, chosen) * scale


def wire(values: torch.Tensor, payload: str) -> torch.Tensor:
    """`values` as the receiving end reads them."""
    if payload in ("", "fp32"):
        return values.clone()
    if payload in ("bf16", "fp16"):
        return values.to(torch.bfloat16 if payload == "bf16" else torch.float16).float()
    out = torch.empty_like(values)
    if payload == "fp4":
        for start in range(0, values.numel(), BLOCK):
            out[start : start + BLOCK] = fp4(values[start : start + BLOCK])
        return out
    levels = {"int8": 127, "int4": 7}[payload]
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
                           payload: str, buckets: int = 1) -> torch.Tensor:
    """EF-SGD's step for every replica at once: each replica r sends C(g_r + e_r) and
    keeps e_r = g_r + e_r - C(g_r + e_r) (`residuals`, updated in place); the mean of what
    was sent. In buckets, each bucket is compressed on its own."""
    total = torch.zeros_like(gradients[0])
    size = gradients[0].numel()
    for r, g in enumerate(gradients):
        p = g + residuals[r] if residuals[r].numel() else g
        sent = torch.cat([compress(p[k * size // buckets : (k + 1) * size // buckets], payload)
                          for k in range(buckets)])
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


def reduce_sum(values: Sequence[torch.Tensor], payload: str, buckets: int = 1) -> torch.Tensor:
    """The sum every replica holds after the all-reduce of these vectors: each bucket
    reduced on its own, quantized ones each replica's quantized once and summed in fp32."""
    total = values[0].numel()
    parts = []
    for k in range(buckets):
        start, end = k * total // buckets, (k + 1) * total // buckets
        chunk = [v[start:end] for v in values]
        if payload in QUANTIZED:
            summed = torch.zeros_like(chunk[0])
            for v in chunk:
                summed += wire(v, payload)
            parts.append(summed)
        else:
            parts.append(ring_sum(chunk, payload))
    return torch.cat(parts)


def train(job: Job, replicas: int, microbatches: int, iterations: int,
          syncs: Callable[[int], list[Sync]], outer: Outer = Outer(),
          gradients: str | None = None, gradient_buckets: int = 1,
          kept: dict[int, dict[str, torch.Tensor]] | None = None
          ) -> list[dict[str, torch.Tensor]]:
    """Each replica's parameters after `iterations`; `gradients`: the payload of an
    every-step gradient all-reduce (None: replicas step apart), in `gradient_buckets`;
    `kept`: its keys are iterations at whose start (`iterations`: at the end) to keep
    replica 0's outer parameters there."""
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
            _all_reduce_gradients(models, residuals, gradients, gradient_buckets)
        for optimizer in inner:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        for sync in syncs(iteration):
            outer_loop.apply(sync)
    if kept is not None and iterations in kept:
        kept[iterations] = outer_loop.snapshot()
    assert not math.isnan(sum(float(p.detach().sum()) for m in models for p in m.parameters()))
    return [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]


def _flat(tensors: dict[str, torch.Tensor], order: list[str]) -> torch.Tensor:
    return torch.cat([tensors[n].reshape(-1) for n in order])


def _all_reduce_gradients(models: Sequence[torch.nn.Module], residuals: list[torch.Tensor],
                          payload: str, buckets: int) -> None:
    """Every replica's gradients replaced by their average: summed as sent uncompressed
    (each bucket on its own), or compressed with error feedback."""
    names = [n for n, _ in models[0].named_parameters()]
    order = backward_order(names) if buckets > 1 else names
    flats = [_flat({n: p.grad for n, p in m.named_parameters()  # type: ignore[misc]
                    }, order) for m in models]
    if payload in ("", "fp32", "bf16", "fp16"):
        average = reduce_sum(flats, payload, buckets) / len(models)
    else:
        average = error_feedback_average(flats, residuals, payload, buckets)
    for m in models:
        params = dict(m.named_parameters())
        offset = 0
        for n in order:
            p = params[n]
            p.grad = average[offset : offset + p.numel()].view_as(p).clone()
            offset += p.numel()


class _OuterLoop:
    """Each replica's outer parameters and its torch SGD per fragment, the averaged deltas
    of the syncs started and not yet stepped, and for eager updates what each replica
    sent in the sync before and that sync's average."""

    def __init__(self, models: Sequence[torch.nn.Module], layers: int, outer: Outer) -> None:
        self.models, self.layers, self.outer = models, layers, outer
        self.names = [n for n, _ in models[0].named_parameters()]
        self.params = [{n: p.detach().clone() for n, p in models[0].named_parameters()}
                       for _ in models]
        self.optimizers: dict[tuple[int, int, int], torch.optim.SGD] = {}
        self.pending: dict[tuple[int, int], torch.Tensor] = {}
        self.fresh: dict[tuple[int, int], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
        self.sent_before: dict[tuple[int, int], list[torch.Tensor]] = {}
        self.previous: dict[tuple[int, int], torch.Tensor] = {}

    def snapshot(self) -> dict[str, torch.Tensor]:
        return {n: p.clone() for n, p in self.params[0].items()}

    def apply(self, sync: Sync) -> None:
        key = (sync.fragment, sync.fragments)
        mine = [n for n in self.names
                if fragment_of(n, self.layers, sync.fragments) == sync.fragment]
        order = backward_order(mine) if sync.buckets > 1 else mine
        if sync.kind == "start":
            self._start(key, order, sync)
            return
        for r in range(len(self.models)):
            self._step(r, key, order)
        if self.outer.eager:
            self.sent_before[key] = self.fresh[key][1]
            self.previous[key] = self.pending[key]

    def _start(self, key: tuple[int, int], order: list[str], sync: Sync) -> None:
        deltas = [_flat(self.params[r], order) - _flat(
            {n: p.detach() for n, p in m.named_parameters()}, order)
            for r, m in enumerate(self.models)]
        self.pending[key] = reduce_sum(deltas, sync.payload, sync.buckets) / len(self.models)
        self.fresh[key] = (deltas, [wire(d, sync.payload) for d in deltas])

    def _average(self, r: int, key: tuple[int, int]) -> torch.Tensor:
        """What replica r's outer step takes: the sync's average, or eagerly its own fresh
        deltas with the others' of the sync before."""
        if not self.outer.eager:
            return self.pending[key]
        replicas = len(self.models)
        own = self.fresh[key][0][r]
        before = self.sent_before.get(key)
        return own / replicas if before is None else \
            self.previous[key] - before[r] / replicas + own / replicas

    def _step(self, r: int, key: tuple[int, int], order: list[str]) -> None:
        """Replica r's outer step on the fragment, then its local copy mixed towards its
        new outer parameters."""
        outer, params = self.outer, self.params[r]
        if (r, *key) not in self.optimizers:
            self.optimizers[(r, *key)] = torch.optim.SGD(
                [params[n] for n in order], lr=outer.lr, momentum=outer.momentum,
                nesterov=outer.nesterov)
        average = self._average(r, key)
        offset = 0
        for n in order:
            count = params[n].numel()
            params[n].grad = average[offset : offset + count].view_as(params[n])
            offset += count
        self.optimizers[(r, *key)].step()
        self.optimizers[(r, *key)].zero_grad(set_to_none=True)
        mixing = 0.0 if outer.eager else outer.mixing
        with torch.no_grad():
            local = dict(self.models[r].named_parameters())
            for n in order:
                local[n].copy_(mixing * local[n] + (1 - mixing) * params[n])

