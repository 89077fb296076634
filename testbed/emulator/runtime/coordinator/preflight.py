"""Checks before an emulated run creates anything: which compute it gets, and whether this
machine can hold it."""

from __future__ import annotations

from testbed.common.choices import ComputeChoice, EmulatedCompute
from testbed.emulator.net.layout import check_limits
from testbed.emulator.runtime.coordinator.memory import (
    check_memory,
    coordinator_now,
    predict_memory,
)
from testbed.errors import InputError
from testbed.plan.host_limits import available_memory
from testbed.plan.model import Plan
from testbed.run.spec import RunSpec


def check_emulable(spec: RunSpec, plan: Plan) -> None:
    """Refuse, before anything is created, a run this machine cannot hold."""
    source = spec.topology.source
    if plan.tp != 1:
        raise InputError(f"the emulator runs one worker per GPU without tensor parallelism "
                         f"(plan has tp {plan.tp}); use `testbed simulate` for it", source,
                         "job.tp")
    check_limits(spec.topology)
    mode = choose_compute(spec.emulate.compute, len(plan.used_gpus()))
    if mode == "real" and spec.job.model.tied_embeddings and plan.pp > 1:
        raise InputError(
            f"a tied output layer split over {plan.pp} stages needs its first and last "
            "stage's gradients summed every step, which real compute does not do: use "
            "--set model.tied_embeddings=false or --compute emulated", source,
            "job.model.tied_embeddings")
    check_memory(predict_memory(spec.topology, spec.job, plan, mode, coordinator_now()),
                 available_memory(), source)


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
