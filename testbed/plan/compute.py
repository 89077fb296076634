"""How long a stage's forward and backward take, from FLOPs and a GPU's sustained rate.

Per layer forward: 2 x tokens x parameters + 4 x batch x seq^2 x hidden (attention scores),
which for a standard GPT layer is the familiar 24*b*s*h^2 + 4*b*s^2*h (a SwiGLU MLP's third
matrix counts as parameters do). Backward costs twice the forward. The last stage adds the
LM head (2 x tokens x hidden x vocab).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypedDict

from testbed.job.fragments import fragment_params
from testbed.job.model import Job, ModelShape
from testbed.plan.activations import in_flight, peak_layers_held
from testbed.plan.collective import Collective, bucket_range, payload_bytes
from testbed.plan.model import Action, Plan
from testbed.topology.model import GpuType, Topology

BACKWARD_FACTOR = 2.0


def layer_forward_flops(model: ModelShape, batch: int) -> float:
    tokens = batch * model.seq_len
    return 2.0 * tokens * model.params_per_layer + 4.0 * batch * model.seq_len**2 * model.hidden


def head_forward_flops(model: ModelShape, batch: int) -> float:
    return 2.0 * batch * model.seq_len * model.hidden * model.vocab


def stage_forward_flops(model: ModelShape, batch: int, layers: int, last: bool) -> float:
    flops = layers * layer_forward_flops(model, batch)
    return flops + (head_forward_flops(model, batch) if last else 0.0)


def stage_params(model: ModelShape, layers: int, first: bool, last: bool) -> int:
    """The weight matrices a stage holds: its layers', the token embedding on the first
    stage and the output layer on the last. A tied output layer is the embedding's
    matrix: held once by a stage that is both, and by each end of a pipeline (as
    Megatron does: its gradient, too, is reduced on both)."""
    params = layers * model.params_per_layer
    if first:
        params += model.embedding_params
    if last and not (first and model.tied_embeddings):
        params += model.embedding_params
    return params


def collective_bytes(job: Job, layers: tuple[int, ...], stage: int, collective: Collective,
                     tp: int = 1) -> int:
    """What one member of the stage's collective contributes: its parameters' gradients
    or deltas (a fragment's, when it names one; a bucket's part of that, when it names
    one; a tensor-parallel GPU's 1/tp), in the collective's payload."""
    params = collective_params(job.model, layers, stage, collective)
    return payload_bytes(params // tp, collective.payload, job.dtype_bytes)


def collective_params(model: ModelShape, layers: tuple[int, ...], stage: int,
                      collective: Collective) -> int:
    """The values (of the whole tensor-parallel group) a collective of the stage covers:
    its fragment's, and of those its bucket's (testbed.plan.buckets)."""
    first, last = stage == 0, stage == len(layers) - 1
    params = stage_params(model, layers[stage], first, last) if collective.whole else \
        fragment_params(model, layers, stage, collective.fragment, collective.fragments)
    start, end = bucket_range(params, collective.bucket, collective.buckets)
    return end - start


@dataclass(frozen=True)
class StageCost:
    """Per-microbatch compute of one stage on one (tensor-parallel group of) GPU(s)."""

    forward_s: float
    """Seconds of one microbatch's forward."""
    backward_s: float
    """Seconds of its backward (twice the forward's FLOPs)."""
    grad_bytes: int
    """Gradient bytes each GPU of the stage all-reduces with its replicas."""

    @property
    def total_s(self) -> float:
        """Forward and backward together."""
        return self.forward_s + self.backward_s

    @property
    def input_s(self) -> float:
        """A split backward's input-gradient half (I). Each half is a matmul the size of
        the forward's, so they are equal shares of B (Qi et al., Zero Bubble Pipeline
        Parallelism, arXiv 2401.10241, take T_F = T_B = T_W; torch's zero-bubble
        schedules assume the same)."""
        return self.backward_s / 2

    @property
    def weight_s(self) -> float:
        """A split backward's weight-gradient half (W); see `input_s`."""
        return self.backward_s - self.input_s


def stage_cost(
    job: Job, layers: int, first: bool, last: bool, gpu: GpuType, tp: int = 1,
    microbatches: int | None = None,
) -> StageCost:
    """One microbatch's compute through a stage of `layers` layers on `gpu` (tp of them
    together), from the FLOP model the simulator runs on, at the GPU type's sustained
    FLOP/s, or at the rate the job's measured `compute_time` gives (`compute_rate`;
    `microbatches` per replica then for a step's): `first` adds the token embedding's
    parameters, `last` the output layer's FLOPs and parameters."""
    forward = stage_forward_flops(job.model, job.microbatch_size, layers, last)
    rate = gpu.sustained_flops * tp if job.compute_time is None else \
        compute_rate(job, microbatches)
    params = stage_params(job.model, layers, first, last)
    return StageCost(
        forward_s=forward / rate,
        backward_s=BACKWARD_FACTOR * forward / rate,
        grad_bytes=params * job.dtype_bytes // tp,
    )


def compute_rate(job: Job, microbatches: int | None) -> float:
    """The FLOP rate of a stage's GPUs the job's measured compute time gives: the FLOPs of
    what it measured (forward and backward, three forwards' worth) over its seconds. A
    step's is every layer and the output layer for each of a replica's `microbatches`."""
    measured = job.compute_time
    assert measured is not None
    model, batch = job.model, job.microbatch_size
    if measured.per == "layer":
        flops = layer_forward_flops(model, batch)
    elif microbatches is None:
        raise ValueError("a step's compute time needs the microbatches a replica computes")
    else:
        flops = microbatches * stage_forward_flops(model, batch, model.layers, True)
    return (1 + BACKWARD_FACTOR) * flops / measured.seconds


def stage_costs(
    topology: Topology,
    job: Job,
    plan: Plan,
    profile: Mapping[int, Mapping[str, float]] | None = None,
) -> list[StageCost]:
    """Per-stage compute: the FLOP model on the stage's GPU type (or at the job's measured
    compute time), or a measured profile (forward_s and backward_s per stage) where one is
    given. What both backends hold each GPU busy for."""
    costs = []
    for stage in range(plan.pp):
        gpu = topology.gpu(plan.lead_gpu(0, stage)).type
        cost = stage_cost(job, plan.layers[stage], stage == 0, stage == plan.pp - 1, gpu, plan.tp,
                          plan.microbatches)
        if profile is not None and stage in profile:
            measured = profile[stage]
            cost = StageCost(
                measured.get("forward_s", cost.forward_s),
                measured.get("backward_s", cost.backward_s),
                cost.grad_bytes,
            )
        costs.append(cost)
    return costs


@functools.lru_cache(maxsize=1 << 16)
def prefill_flops(model: ModelShape, end: int, start: int = 0) -> float:
    """Prefill of prompt tokens [start, end) through the whole inference model: the layers'
    FLOPs up to `end` less those up to `start` (so a prompt's chunks add up to the whole
    prompt), and the head once for the token it predicts. Kept per argument: a bubble
    policy asks for the same lengths thousands of times a run."""
    def layers_upto(tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        return model.layers * layer_forward_flops(replace(model, seq_len=tokens), 1)

    head = head_forward_flops(replace(model, seq_len=1), 1)
    return layers_upto(end) - layers_upto(start) + head


def kv_cache_bytes(model: ModelShape, prompt_len: int, dtype_bytes: int = 2) -> int:
    """2 (K and V) x layers x KV heads x head dim x bytes, per token."""
    return 2 * model.layers * model.n_kv_heads * model.head_dim * dtype_bytes * prompt_len


def ring_allreduce_s(nbytes: int, members: int, bandwidth_bps: float, latency_s: float) -> float:
    """Ring all-reduce: 2(n-1) steps, each moving 1/n of the data over one link."""
    if members <= 1:
        return 0.0
    steps = 2 * (members - 1)
    return steps * (nbytes / members * 8 / bandwidth_bps + latency_s)


def ring_allgather_s(nbytes: int, members: int, bandwidth_bps: float, latency_s: float) -> float:
    """Ring all-gather of every member's `nbytes` (a sparse payload, which does not add up
    on the way): n-1 steps, each moving one member's bytes over one link."""
    if members <= 1:
        return 0.0
    return (members - 1) * (nbytes * 8 / bandwidth_bps + latency_s)


OPTIMIZER_BYTES_PER_PARAM = 16
"""Mixed-precision Adam: bf16 weights and gradients, fp32 master weights and two moments."""


def gpu_memory_bytes(job: Job, layers: Sequence[int], stages: Sequence[int], tp: int,
                     actions: Iterable[Action]) -> int:
    """A GPU's memory: the parameters with optimizer state of every stage it holds, plus
    the inputs of every layer for each microbatch whose activations it holds (activation
    checkpointing, the common practice at this scale; the layer internals are recomputed
    in the backward) at its worst moment, read from its actions (testbed.plan.activations).
    A tensor-parallel GPU holds 1/tp of both."""
    last = len(layers) - 1
    params = sum(stage_params(job.model, layers[s], s == 0, s == last) for s in stages)
    return params * OPTIMIZER_BYTES_PER_PARAM // tp + activation_bytes_held(
        job, layers, stages, tp, actions)


def activation_bytes_held(job: Job, layers: Sequence[int], stages: Sequence[int], tp: int,
                          actions: Iterable[Action]) -> int:
    """The activations part of `gpu_memory_bytes`: at the GPU's worst moment."""
    held = peak_layers_held(actions, {s: layers[s] for s in stages})
    return held * job.activation_bytes // tp


class GpuMemory(TypedDict):
    """One GPU's entry in the simulator's `memory` block of results.json."""

    stages: list[int]
    activations_bytes: int
    total_bytes: int
    microbatches_held: dict[str, int]
    """The most microbatches each of its stages holds, by stage."""


def memory_summary(job: Job, plan: Plan) -> dict[str, GpuMemory]:
    """Per GPU of replica 0 (the other replicas' hold the same), in the program of the
    plan's cycle that needs most: the activations it holds at its worst moment, that plus
    parameters and optimizer state, and the most microbatches each of its stages holds
    (the `memory` block of results.json)."""
    out: dict[str, GpuMemory] = {}
    for (replica, _), gpus in plan.workers():
        gpu = gpus[0]
        if replica or gpu in out:
            continue
        stages = plan.stages_of(gpu)
        lists = [program[gpu] for program in plan.all_programs()]
        held: dict[int, int] = {}
        for actions in lists:
            for stage, count in in_flight(actions).items():
                held[stage] = max(held.get(stage, 0), count)
        out[gpu] = {
            "stages": list(stages),
            "activations_bytes": max(activation_bytes_held(job, plan.layers, stages, plan.tp,
                                                           a) for a in lists),
            "total_bytes": max(gpu_memory_bytes(job, plan.layers, stages, plan.tp, a)
                               for a in lists),
            "microbatches_held": {str(s): n for s, n in sorted(held.items())},
        }
    return out
