"""Whether a GPU that fills bubbles holds both its training stage and the inference model:
the inference weights (bf16) and the KV cache of the longest prompt (kept between the
chunks of a chunked prefill) plus one pass of `max_batch_tokens`. Pure."""

from __future__ import annotations

from testbed.compute import stage_memory_bytes, stage_params
from testbed.errors import InputError
from testbed.inference import kv_bytes, longest_prompt
from testbed.job import DTYPE_BYTES, Job
from testbed.plan.model import Op, Plan
from testbed.topology import Topology


def in_flight_of(plan: Plan, gpu: str) -> int:
    """Most microbatches whose activations the GPU holds at once: forwards run whose
    backward has not (read from its action lists, so any schedule counts right), in the
    program of the plan's cycle that holds most."""
    most = 0
    for program in plan.all_programs():
        held = 0
        for action in program[gpu]:
            if action.op is Op.F:
                held += 1
                most = max(most, held)
            elif action.op is Op.B:
                held -= 1
    return most


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
        if replica:
            continue  # replicas of a stage hold the same
        gpu = topology.gpu(gpus[0]).type
        training = stage_memory_bytes(job, plan.layers[stage], stage == 0,
                                      stage == plan.pp - 1, plan.tp, in_flight_of(plan, gpus[0]))
        if training + extra > gpu.memory_bytes:
            raise InputError(
                f"filling bubbles does not fit: stage {stage} ({plan.layers[stage]} layers) "
                f"needs {training / 2**30:.1f} GiB per GPU for training and the inference "
                f"model {extra / 2**30:.1f} GiB more (weights and KV cache), "
                f"{gpus[0]} ({gpu.name}) has {gpu.memory_bytes / 2**30:.0f} GiB: use more "
                "stages, a smaller inference model or shorter prompts",
                topology.source, "job.inference")
