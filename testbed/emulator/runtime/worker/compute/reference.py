"""The same training in one process: what pipeline + data parallel training must equal."""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

from testbed.emulator.runtime.worker.compute.model import (
    build_model,
    inner_optimizer,
    loss_of,
    make_corpus,
    sample_index,
)
from testbed.job.model import Job


def train_one_process(job: Job, dp: int, microbatches: int,
                      later: Sequence[tuple[int, int, int]] = ()) -> dict[str, torch.Tensor]:
    """Train the whole model on the same samples, in the same order, with the same
    gradient scaling (mean over microbatches, then over replicas) and optimizer.
    `later`: (first iteration, dp, microbatches) of plans the run went on with (a run
    replanned after losing a worker)."""
    torch.set_num_threads(1)
    model = build_model(job.model, job.seed)
    optimizer = inner_optimizer(model.parameters(), job.optimizer)
    corpus = make_corpus(job.model, job.seed, job.data)
    for iteration in range(job.iterations):
        for first, then_dp, then_microbatches in later:
            if iteration >= first:
                dp, microbatches = then_dp, then_microbatches
        grads: list[torch.Tensor] | None = None
        for replica in range(dp):
            for microbatch in range(microbatches):
                start = sample_index(
                    iteration, replica, microbatch, dp, microbatches, job.microbatch_size
                )
                inputs, targets = corpus.batch(start, job.microbatch_size)
                (loss_of(model(inputs), targets) / microbatches).backward()  # type: ignore[no-untyped-call]
            replica_grads = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
            grads = (
                replica_grads
                if grads is None
                else [a + b for a, b in zip(grads, replica_grads, strict=True)]
            )
            optimizer.zero_grad(set_to_none=True)
        assert grads is not None
        for p, g in zip(model.parameters(), grads, strict=True):
            p.grad = g / dp
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def merge_stages(
    stages: list[dict[str, torch.Tensor]], layers: tuple[int, ...]
) -> dict[str, torch.Tensor]:
    """Stage state dicts under the whole model's names (block indices made global)."""
    merged: dict[str, torch.Tensor] = {}
    first = 0
    for state, count in zip(stages, layers, strict=True):
        for name, value in state.items():
            match = re.match(r"blocks\.(\d+)\.(.*)", name)
            if match:
                name = f"blocks.{first + int(match.group(1))}.{match.group(2)}"
            merged[name] = value
        first += count
    return merged
