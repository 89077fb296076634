"""Checks before an emulated run creates anything: which compute it gets, and whether this
machine can hold it."""

from __future__ import annotations

from pathlib import Path

from testbed.choices import ComputeChoice, EmulatedCompute
from testbed.compute import stage_params
from testbed.errors import InputError
from testbed.net.layout import check_limits
from testbed.plan.model import Plan
from testbed.run_spec import RunSpec

WORKER_BYTES = {"emulated": 60 * 2**20, "real": 450 * 2**20}
"""Resident memory of one worker process before its model (measured: about 28 MB
emulated, 330 MB with torch and a tiny model), with a margin."""


def check_emulable(spec: RunSpec, plan: Plan) -> None:
    """Refuse, before anything is created, a run this machine cannot hold."""
    source = spec.topology.source
    if plan.tp != 1:
        raise InputError(f"the emulator runs one worker per GPU without tensor parallelism "
                         f"(plan has tp {plan.tp}); use `testbed simulate` for it", source,
                         "job.tp")
    check_limits(spec.topology)
    mode = choose_compute(spec.compute, len(plan.used_gpus()))
    if mode == "real" and spec.job.model.tied_embeddings and plan.pp > 1:
        raise InputError(
            f"a tied output layer split over {plan.pp} stages needs its first and last "
            "stage's gradients summed every step, which real compute does not do: use "
            "--set model.tied_embeddings=false or --compute emulated", source,
            "job.model.tied_embeddings")
    need = len(plan.used_gpus()) * WORKER_BYTES[mode]  # a worker per GPU, whatever it holds
    if mode == "real":  # fp32 weights, grads, Adam moments of every stage's replicas
        need += plan.dp * 16 * sum(stage_params(spec.job.model, layers, stage == 0,
                                                stage == plan.pp - 1)
                                   for stage, layers in enumerate(plan.layers))
    available = available_memory()
    if available is not None and need > available:
        raise InputError(
            f"{len(plan.used_gpus())} workers with {mode} compute need about "
            f"{need / 2**30:.1f} GiB of memory; this machine has {available / 2**30:.1f} GiB "
            f"available (MemAvailable){'; try --compute emulated' if mode == 'real' else ''}",
            source, "datacenters")


def available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None




def choose_compute(requested: ComputeChoice, workers: int) -> EmulatedCompute:
    """`auto`: real compute where there is a GPU per worker, emulated otherwise."""
    if requested != "auto":
        return requested
    try:
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        gpus = 0
    return "real" if gpus >= workers else "emulated"
