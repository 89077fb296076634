"""Buckets: which values of a stage each one holds, and how far into the backward all of
them are there.

Torch's DistributedDataParallel reduces gradients in buckets of 25 MiB (`bucket_cap_mb`)
filled in the order the backward produces gradients, and starts a bucket's all-reduce as
soon as every gradient in it is ready, so that reducing overlaps the rest of the backward
(Li et al., "PyTorch Distributed", VLDB 2020). Here what a collective covers (a stage's
gradient, or one fragment of its deltas) is laid out in that order: the output layer, the
blocks from last to first, the embeddings; bucket k of N holds the k-th N-th of it
(testbed.plan.collective.bucket_range), N being what a bucket size gives (`bucket_count`).
A bucket is ready when the last unit (layer, output layer or embeddings) it touches has
had its backward: the simulator and emulated compute take the units' backward times in
proportion to their FLOPs (testbed.plan.compute); real compute watches the gradients
themselves (testbed.emulator.runtime.worker.compute.bucket_hooks). Pure.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

from testbed.job.fragments import block_fragment, embedding_fragment, head_fragment, stage_blocks
from testbed.job.model import Job, ModelShape
from testbed.plan.collective import Collective, bucket_range
from testbed.plan.compute import collective_params, head_forward_flops, layer_forward_flops

DDP_BUCKET_MB = 25.0
"""torch DistributedDataParallel's default bucket size (`bucket_cap_mb`), in MiB."""

UnitKind = Literal["head", "block", "embed"]


@dataclass(frozen=True)
class Unit:
    """A part of a stage the backward finishes at once: the output layer (its final norm
    too), one transformer block (by its global index), or the token and position
    embeddings."""

    kind: UnitKind
    block: int = -1
    params: int = 0
    """Its weight matrices, as testbed.plan.compute.stage_params counts them."""
    flops: float = 0.0
    """Its forward's FLOPs per sequence: its backward's share of the stage's."""


def stage_units(model: ModelShape, layers: tuple[int, ...], stage: int) -> tuple[Unit, ...]:
    """Every unit of a stage, in the order its backward finishes them."""
    return _stage_units(model, layers, stage)


@functools.lru_cache(maxsize=1024)
def _stage_units(model: ModelShape, layers: tuple[int, ...], stage: int) -> tuple[Unit, ...]:
    first, last = stage == 0, stage == len(layers) - 1
    out: list[Unit] = []
    if last:  # a tied output layer in a stage that embeds is the embedding's matrix
        params = 0 if first and model.tied_embeddings else model.embedding_params
        out.append(Unit("head", -1, params, head_forward_flops(model, 1)))
    out += [Unit("block", b, model.params_per_layer, layer_forward_flops(model, 1))
            for b in reversed(stage_blocks(layers, stage))]
    if first:
        out.append(Unit("embed", -1, model.embedding_params, 0.0))
    return tuple(out)


def unit_fragment(unit: Unit, layers: int, fragments: int) -> int:
    """The fragment a unit belongs to (testbed.job.fragments' rules)."""
    if unit.kind == "block":
        return block_fragment(unit.block, fragments)
    if unit.kind == "embed":
        return embedding_fragment(fragments)
    return head_fragment(layers, fragments)


def covered_units(model: ModelShape, layers: tuple[int, ...], stage: int,
                  collective: Collective) -> tuple[Unit, ...]:
    """The units whose values `collective` covers (before bucketing), in backward order."""
    return tuple(u for u in stage_units(model, layers, stage)
                 if unit_fragment(u, model.layers, collective.fragments) == collective.fragment)


def bucket_count(params: int, dtype_bytes: int, bucket_mb: float) -> int:
    """Buckets of at most `bucket_mb` MiB a collective of `params` values needs (at least
    one)."""
    if bucket_mb <= 0:
        raise ValueError(f"a bucket size must be positive, got {bucket_mb} MiB")
    return max(1, math.ceil(params * dtype_bytes / (bucket_mb * 2**20)))


def in_buckets(job: Job, layers: tuple[int, ...], stage: int, collective: Collective,
               bucket_mb: float | None) -> list[Collective]:
    """`collective` of `stage` as its buckets of at most `bucket_mb` MiB of the job's dtype
    per GPU (itself alone when None, or when it fits one)."""
    if bucket_mb is None:
        return [collective]
    count = bucket_count(collective_params(job.model, layers, stage, collective) // job.tp,
                         job.dtype_bytes, bucket_mb)
    return [collective.in_bucket(k, count) for k in range(count)] if count > 1 \
        else [collective]


def bucket_ready(model: ModelShape, layers: tuple[int, ...], stage: int,
                 collective: Collective) -> float:
    """The fraction of the stage's backward done when every value of the collective's
    bucket is there: the end of the last unit it touches (the whole collective: 1.0 but
    for a fragment whose last unit ends earlier)."""
    units = stage_units(model, layers, stage)
    total = sum(u.flops for u in units)
    ends: dict[Unit, float] = {}
    done = 0.0
    for unit in units:
        done += unit.flops
        ends[unit] = done / total if total else 1.0
    covered = covered_units(model, layers, stage, collective)
    count = sum(u.params for u in covered)
    if not covered or count == 0:
        return 0.0
    _, end = bucket_range(count, collective.bucket, collective.buckets)
    before = 0
    for unit in covered:  # the unit holding the bucket's last value
        before += unit.params
        if before >= end and unit.params:
            return ends[unit]
    return ends[covered[-1]]

