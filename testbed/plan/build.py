"""Helpers policies share to turn a placement into a full Plan."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from testbed.compute import in_flight, stage_memory_bytes
from testbed.errors import InputError
from testbed.job import Job
from testbed.plan.model import Action, Plan, Sharing, Worker, pair_key, split_layers
from testbed.plan.schedules import stage_actions
from testbed.topology.model import Topology

PIPELINE = "pipeline"
ALLREDUCE = "allreduce"
TENSOR = "tensor"


def communicating_pairs(
    placement: Mapping[Worker, tuple[str, ...]], dp: int, pp: int, tp: int
) -> list[tuple[str, str, str]]:
    """(gpu, gpu, kind) for every pair that exchanges tensors; kind says what flows."""
    pairs: list[tuple[str, str, str]] = []
    for replica in range(dp):
        for stage in range(pp):
            gpus = placement[(replica, stage)]
            if stage + 1 < pp:
                nxt = placement[(replica, stage + 1)]
                pairs += [(gpus[t], nxt[t], PIPELINE) for t in range(tp)]
            if dp > 1 and (dp > 2 or replica == 0):
                peer = placement[((replica + 1) % dp, stage)]
                pairs += [(gpus[t], peer[t], ALLREDUCE) for t in range(tp)]
            for i in range(tp):
                for j in range(i + 1, tp):
                    pairs.append((gpus[i], gpus[j], TENSOR))
    return pairs


def file_order_placement(
    topology: Topology, dp: int, pp: int, tp: int
) -> dict[Worker, tuple[str, ...]]:
    """GPUs taken in file order, a stage's replicas side by side: the naive placement."""
    gpus = [gpu.name for gpu in topology.gpus()]
    need = dp * pp * tp
    if need > len(gpus):
        raise InputError(
            f"dp {dp} x pp {pp} x tp {tp} needs {need} GPUs, the topology has {len(gpus)}",
            topology.source,
            "job",
        )
    placement = {}
    for stage in range(pp):
        for replica in range(dp):
            first = (stage * dp + replica) * tp
            placement[(replica, stage)] = tuple(gpus[first : first + tp])
    return placement


def check_memory(topology: Topology, job: Job, placement: Mapping[Worker, tuple[str, ...]],
                 pp: int, microbatches: int, schedule: str) -> None:
    """Refuse a plan whose stage does not fit in its GPUs' memory, naming where."""
    layers = split_layers(job.model.layers, pp)
    for (_replica, stage), gpus in sorted(placement.items()):
        gpu = topology.gpu(gpus[0]).type
        need = stage_memory_bytes(job, layers[stage], stage == 0, stage == pp - 1, job.tp,
                                  in_flight(schedule, stage, pp, microbatches))
        if need > gpu.memory_bytes:
            raise InputError(
                f"stage {stage} ({layers[stage]} layers, tp {job.tp}) needs "
                f"{need / 2**30:.1f} GiB per GPU, {gpus[0]} ({gpu.name}) has "
                f"{gpu.memory_bytes / 2**30:.0f} GiB: use more stages or tensor parallelism",
                topology.source, "job")


def fits_memory(topology: Topology, job: Job, placement: Mapping[Worker, tuple[str, ...]],
                pp: int, microbatches: int, schedule: str) -> bool:
    try:
        check_memory(topology, job, placement, pp, microbatches, schedule)
    except InputError:
        return False
    return True


def default_pp(topology: Topology, job: Job) -> int:
    """One stage per datacenter unless the job says otherwise (and never more than layers)."""
    return job.pp if job.pp is not None else min(len(topology.datacenters), job.model.layers)


def assemble(
    policy: str,
    schedule: str,
    topology: Topology,
    job: Job,
    placement: Mapping[Worker, tuple[str, ...]],
    dp: int,
    pp: int,
    connections: Callable[[str, str, str], int],
    sharing: Sharing,
    dp_cells: tuple[tuple[int, ...], ...] = (),
    notes: Mapping[str, Any] | None = None,
) -> Plan:
    """A Plan from a placement: schedule actions, connection counts, link sharing."""
    microbatches = job.microbatches_for(dp)
    check_memory(topology, job, placement, pp, microbatches, schedule)
    actions: dict[str, tuple[Action, ...]] = {}
    for (_, stage), gpus in placement.items():
        lst = tuple(stage_actions(schedule, stage, pp, microbatches, dp))
        for gpu in gpus:
            actions[gpu] = lst
    conns: dict[tuple[str, str], int] = {}
    shared: dict[tuple[str, str], Sharing] = {}
    for a, b, kind in communicating_pairs(placement, dp, pp, job.tp):
        conns[pair_key(a, b)] = connections(a, b, kind)
        dc_a, dc_b = topology.dc_of(a), topology.dc_of(b)
        if dc_a != dc_b:
            link_sharing = sharing if kind == PIPELINE else Sharing.FAIR
            for direction in ((dc_a, dc_b), (dc_b, dc_a)):
                if shared.get(direction) is not Sharing.ARBITRATED:
                    shared[direction] = link_sharing
    return Plan(
        policy=policy,
        dp=dp,
        pp=pp,
        microbatches=microbatches,
        microbatch_size=job.microbatch_size,
        layers=split_layers(job.model.layers, pp),
        placement=dict(placement),
        actions=actions,
        connections=conns,
        sharing=shared,
        tp=job.tp,
        dp_cells=dp_cells,
        notes=dict(notes or {}),
    )
