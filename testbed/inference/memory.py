"""Whether a GPU that fills bubbles holds both its training stage and the inference model:
the inference weights (bf16) and the KV cache of the longest prompt (kept between the
chunks of a chunked prefill) plus one pass of `max_batch_tokens`. Pure."""

from __future__ import annotations

from testbed.errors import InputError
from testbed.inference.workload import kv_bytes, longest_prompt
from testbed.job.model import DTYPE_BYTES, Job
from testbed.plan.activations import peak_layers_held
from testbed.plan.compute import gpu_memory_bytes, stage_params
from testbed.plan.model import Plan
from testbed.topology import Topology


def in_flight_of(plan: Plan, gpu: str) -> int:
    """Most microbatches whose activations the GPU holds at once (of all its stages), in
    the program of the plan's cycle that holds most (testbed.plan.activations)."""
    ones = dict.fromkeys(plan.stages_of(gpu), 1)
    return max(peak_layers_held(program[gpu], ones) for program in plan.all_programs())


def training_bytes(job: Job, plan: Plan, gpu: str) -> int:
    """What the GPU's stages need for training, in the program that needs most."""
    return max(gpu_memory_bytes(job, plan.layers, plan.stages_of(gpu), plan.tp, program[gpu])
               for program in plan.all_programs())


def inference_bytes(job: Job) -> int:
    """What the inference model adds on a GPU that fills bubbles."""
    workload = job.inference
    if workload is None:
        return 0
    model = workload.model
    weights = stage_params(model, model.layers, True, True) * DTYPE_BYTES["bf16"]
    return weights + kv_bytes(workload, longest_prompt(workload) + workload.max_batch_tokens)


def check_inference_memory(topology: Topology, job: Job, plan: Plan) -> None:
    """Refuse, naming the GPU and the numbers, a plan whose stage and the inference model
    do not fit together."""
    extra = inference_bytes(job)
    if not extra:
        return
    for (replica, stage), gpus in sorted(plan.placement.items()):
        if replica or stage != plan.stages_of(gpus[0])[0]:
            continue  # replicas of a stage hold the same; a GPU counts once
        gpu = topology.gpu(gpus[0]).type
        training = training_bytes(job, plan, gpus[0])
        held = plan.stages_of(gpus[0])
        what = f"stage {stage} ({plan.layers[stage]} layers)" if len(held) == 1 else \
            f"stages {', '.join(map(str, held))} ({sum(plan.layers[s] for s in held)} layers)"
        if training + extra > gpu.memory_bytes:
            raise InputError(
                f"filling bubbles does not fit: {what} "
                f"needs {training / 2**30:.1f} GiB per GPU for training and the inference "
                f"model {extra / 2**30:.1f} GiB more (weights and KV cache), "
                f"{gpus[0]} ({gpu.name}) has {gpu.memory_bytes / 2**30:.0f} GiB: use more "
                "stages, a smaller inference model or shorter prompts",
                topology.source, "job.inference")
