"""Real compute: a pipeline stage of the transformer in torch, on CUDA when present (a
worker holding several stages has one engine for each)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from testbed.emulator.runtime.wire.messages import Config, PrefillPart
from testbed.emulator.runtime.worker.collectives.allreduce import Contribution, Received
from testbed.emulator.runtime.worker.collectives.in_backward import InBackward
from testbed.emulator.runtime.worker.collectives.syncs import Syncs
from testbed.emulator.runtime.worker.compute.bucket_hooks import BackwardBuckets
from testbed.emulator.runtime.worker.compute.model import (
    Samples,
    Stage,
    backward_order,
    build_stages,
    inner_optimizer,
    loss_of,
    make_corpus,
    parameter_fragments,
    sample_index,
)
from testbed.emulator.runtime.worker.compute.split_backward import input_gradient, weight_gradients
from testbed.errors import TestbedError
from testbed.job.model import ModelShape
from testbed.plan.collective import Collective


def real_engines(config: Config) -> dict[int, RealEngine]:
    """An engine for each stage the worker holds: its own module (initialized as the
    whole model would be), optimizer, gradients and syncs."""
    shape = config.model
    try:
        corpus = make_corpus(shape, config.seed, config.data)
    except ValueError as exc:
        raise TestbedError(f"the job's data cannot be used on this machine: {exc} (a run "
                           "across machines needs it at the same path on each)") from None
    torch.set_num_threads(1)  # one worker per GPU; on a CPU its cores are shared
    layers = tuple(config.layers)
    modules = build_stages(shape, layers, config.seed)
    device = pick_device(config.local_rank)
    engines = {}
    for stage in config.stages:
        module = modules[stage].to(device)
        syncs = Syncs([(n, p) for n, p in module.named_parameters() if p.requires_grad],
                      functools.partial(parameter_fragments, module, layers, stage),
                      config.outer, [Collective.parse(c.collective) for c in config.collectives
                                     if c.stage == stage], config.dp,
                      backward_order(module, layers, stage))
        engines[stage] = RealEngine(
            stage, config.pp, config.replica, config.dp, config.microbatches,
            config.microbatch_size, shape, module, corpus, device,
            inner_optimizer(module.parameters(), config.optimizer), syncs, config.seed,
            config.inference_model, config.period,
            config.iterations if config.keeps_outer_model else -1)
        engines[stage].keep_synced(0)
    return engines


def pick_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


@dataclass
class RealEngine:
    stage: int
    stages: int
    replica: int
    dp: int
    microbatches: int
    microbatch_size: int
    shape: ModelShape
    module: Stage
    corpus: Samples
    device: torch.device
    optimizer: torch.optim.Optimizer
    syncs: Syncs
    seed: int = 0
    inference_model: ModelShape | None = None
    period: int = 1
    iterations: int = -1
    """The run's; -1 keeps no synchronized model (not every stage has one)."""
    synced: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    """Replica 0's synchronized model (the outer parameters) of this stage, on the host,
    by the iteration it is evaluated at: the run's start, and each one after a cycle ends,
    when every fragment has synced, the run's end too (DiLoCo family;
    testbed.emulator.runtime.worker.synced_loss)."""
    _saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = field(default_factory=dict)
    """By microbatch, from its forward to its backward: the stage's input (None on the
    first stage) and output (the loss on the last)."""
    _weights_due: dict[int, Callable[[], None]] = field(default_factory=dict)
    """By microbatch, from a split backward's input half to its weight half."""
    _losses: list[float] = field(default_factory=list)
    _prefiller: Any = None

    @property
    def first(self) -> bool:
        return self.stage == 0

    @property
    def last(self) -> bool:
        return self.stage == self.stages - 1

    def _tokens(self, iteration: int, microbatch: int, replica: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        start = sample_index(iteration, self.replica if replica is None else replica,
                             microbatch, self.dp, self.microbatches, self.microbatch_size)
        inputs, targets = self.corpus.batch(start, self.microbatch_size)
        return inputs.to(self.device), targets.to(self.device)

    def _activation(self, data: Received) -> torch.Tensor:
        assert data is not None
        if not isinstance(data, bytearray):  # handed over on this GPU: torch wants it writable
            data = bytearray(data)
        shape = (self.microbatch_size, self.shape.seq_len, self.shape.hidden)
        return torch.frombuffer(data, dtype=torch.float32).view(shape).to(self.device)

    def forward(self, iteration: int, microbatch: int, received: Received) -> bytes | None:
        if self.first:
            x, _ = self._tokens(iteration, microbatch)
            inputs = None
        else:
            x = self._activation(received).requires_grad_(True)
            inputs = x
        out = self.module(x)
        if self.last:
            _, targets = self._tokens(iteration, microbatch)
            loss = loss_of(out, targets) / self.microbatches
            self._losses.append(float(loss.detach()) * self.microbatches)
            self._saved[microbatch] = (inputs, loss)
            return None
        self._saved[microbatch] = (inputs, out)
        return _to_bytes(out.detach())

    def _output_grad(self, received: Received) -> torch.Tensor | None:
        """What the backward starts from: the next stage's gradient (the loss's own on
        the last stage)."""
        return None if self.last else self._activation(received)

    def backward(self, iteration: int, microbatch: int, received: Received,
                 starts: Sequence[InBackward] = ()) -> bytes | None:
        inputs, out = self._saved.pop(microbatch)
        with BackwardBuckets(self.syncs, self.optimizer, starts):
            out.backward(self._output_grad(received))  # type: ignore[no-untyped-call]
        if self.first:
            return None
        assert inputs is not None and inputs.grad is not None
        return _to_bytes(inputs.grad)

    def input_gradient(self, iteration: int, microbatch: int, received: Received
                       ) -> bytes | None:
        inputs, out = self._saved.pop(microbatch)
        grad = self._output_grad(received)
        if inputs is None:  # the first stage: no input gradient; W runs the whole
            self._weights_due[microbatch] = functools.partial(  # backward, as torch's does
                out.backward, grad)
            return None
        found, held = input_gradient(out, grad, inputs, self.module.parameters())
        self._weights_due[microbatch] = functools.partial(weight_gradients, held)
        return _to_bytes(found)

    def weight_gradient(self, iteration: int, microbatch: int,
                        starts: Sequence[InBackward] = ()) -> None:
        with BackwardBuckets(self.syncs, self.optimizer, starts):
            self._weights_due.pop(microbatch)()

    def contribute(self, collective: Collective, nbytes: int, members: int) -> Contribution:
        return self.syncs.contribute(collective, members)

    def reduced(self, collective: Collective, contribution: Contribution,
                members: int) -> None:
        self.syncs.reduced(collective, contribution, members)

    def step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def outer_step(self, collective: Collective) -> None:
        self.syncs.outer_step(collective)

    def quick(self) -> bool:
        return False

    def iteration_done(self, iteration: int) -> None:
        if (iteration + 1) % self.period == 0:
            self.keep_synced(iteration + 1)

    def keep_synced(self, iteration: int) -> None:
        """Keep the synchronized model as iteration `iteration` starts (the last one kept
        is the model the run ends with), where this stage has one (replica 0 keeps it for
        all: the replicas' outer parameters are equal)."""
        if self.replica == 0 and self.syncs.outer and iteration <= self.iterations:
            self.synced[iteration] = {n: t.clone() for n, t in self.syncs.outer.items()}

    def synced_at(self) -> list[int]:
        return sorted(self.synced)

    def evaluate(self, iteration: int, replica: int, microbatch: int, received: Received
                 ) -> bytes | float:
        """The synchronized model kept for `iteration` on that iteration's microbatch of
        `replica`: the activations to send on, or on the last stage the loss as a step
        reports it."""
        params = {n: t.to(self.device) for n, t in self.synced[iteration].items()}
        x = self._tokens(iteration, microbatch, replica)[0] if self.first \
            else self._activation(received)
        with torch.no_grad():
            out = torch.func.functional_call(self.module, params, (x,))
            if self.last:
                _, targets = self._tokens(iteration, microbatch, replica)
                return float(loss_of(out, targets) / self.microbatches) * self.microbatches
        return _to_bytes(out)

    def prefill(self, parts: Sequence[PrefillPart], modeled_s: float) -> dict[int, bytes]:
        """The pass's parts one after another (prompts of different lengths, no padding)."""
        if self._prefiller is None:
            from testbed.emulator.runtime.worker.compute.prefill import Prefiller

            assert self.inference_model is not None, "no inference model configured"
            self._prefiller = Prefiller(self.inference_model, self.seed, self.device)
        out = {}
        for part in parts:
            kv = self._prefiller.run(part.request, part.prompt_len, part.start, part.end)
            if kv is not None:
                out[part.request] = kv
        return out

    def save(self, path: str) -> None:
        torch.save({k: v.detach().cpu() for k, v in self.module.state_dict().items()}, path)

    def checkpoint(self, path: str) -> None:
        torch.save({"model": self.module.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "syncs": self.syncs.state_dict(), "synced": self.synced}, path)

    def restore(self, path: str) -> None:
        state = torch.load(path, map_location=self.device)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if "syncs" in state:  # saved before plans had syncs of their own
            self.syncs.load_state_dict(state["syncs"])
        self.synced.update({i: {n: t.cpu() for n, t in kept.items()}
                            for i, kept in state.get("synced", {}).items()})

    def take_loss(self) -> float | None:
        if not self.last or not self._losses:
            return None
        loss = sum(self._losses) / len(self._losses)
        self._losses.clear()
        return loss


def _to_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.to(torch.float32).contiguous().cpu().numpy().tobytes()
