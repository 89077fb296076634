"""Helpers policies share to turn a placement into a full Plan."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from testbed.common.sizes import MAX_MICROBATCHES
from testbed.common.units import plural
from testbed.errors import InputError
from testbed.job.model import Job
from testbed.plan.buckets import in_buckets
from testbed.plan.collective import EVERY_STEP, Collective
from testbed.plan.compute import gpu_memory_bytes
from testbed.plan.lowering import lower
from testbed.plan.model import (
    Action,
    HostTcp,
    Plan,
    Sharing,
    SyncOrder,
    Worker,
    pair_key,
    split_layers,
)
from testbed.plan.schedules import Sends, parse_schedule, schedule_compute, stage_actions
from testbed.plan.torch_order import (
    TORCH_CLASSES,
    V_SHAPED,
    TorchOrder,
    checked_torch_order,
    stage_ranks,
)
from testbed.topology.model import Topology


class LinkKind(StrEnum):
    """What flows between two communicating GPUs: a policy may connect each kind its way."""

    PIPELINE = "pipeline"
    """Activations and gradients between consecutive stages."""
    ALLREDUCE = "allreduce"
    """Gradients between replicas of a stage."""
    TENSOR = "tensor"
    """Between the GPUs of one tensor-parallel group."""


PIPELINE = LinkKind.PIPELINE
ALLREDUCE = LinkKind.ALLREDUCE
TENSOR = LinkKind.TENSOR

Warmup = int | Sequence[int]
"""Extra warm-up forwards: one count for every stage, or one per stage."""


class Schedule(StrEnum):
    """The pipeline schedules plans can run; torch's, with several stages per GPU, take
    their order from torch's own classes (testbed.plan.torch_order)."""

    GPIPE = "gpipe"
    """Every microbatch's forward, then every backward."""
    ONE_F_ONE_B = "1f1b"
    """Warm-up forwards, then a forward and a backward in turn (see `extra_warmup`)."""
    INTERLEAVED_1F1B = "interleaved-1f1b"
    """torch's ScheduleInterleaved1F1B: several stages per GPU, looped."""
    LOOPED_BFS = "looped-bfs"
    """torch's ScheduleLoopedBFS: several stages per GPU, a stage's microbatches at once."""
    INTERLEAVED_ZB = "interleaved-zb"
    """torch's ScheduleInterleavedZeroBubble: split backwards fill the bubbles."""
    ZB_V = "zb-v"
    """torch's ScheduleZBVZeroBubble: two stages per GPU in a V, split backwards."""
    DUALPIPE_V = "dualpipe-v"
    """torch's ScheduleDualPipeV: a V of two stages per GPU, forward and backward overlapped."""
    TORCH_CSV = "torch-csv"
    """An order read from torch's CSV form of a schedule (build_plan's `order`)."""

    @property
    def from_torch(self) -> bool:
        """Its order is torch's (TORCH_CLASSES, or a CSV of torch's), lowered as torch's
        runtime lowers it (testbed.plan.lowering)."""
        return self.value in TORCH_CLASSES or self is Schedule.TORCH_CSV

    @property
    def v_shaped(self) -> bool:
        """Exactly two stages per GPU, g and 2P - 1 - g."""
        return self.value in V_SHAPED

    def label(self, extra_warmup: Warmup = 0) -> str:
        """The text form plans, the compute model and notes use: `gpipe`, `1f1b`, `1f1b+K`
        (1F1B with K more warm-up forwards, to cover long round trips) or `1f1b+K0/K1/...`
        (a count per stage, never growing down the pipeline)."""
        counts = (extra_warmup,) if isinstance(extra_warmup, int) else tuple(extra_warmup)
        if any(c < 0 for c in counts):
            raise ValueError(f"extra_warmup must not be negative, got {extra_warmup}")
        if any(counts) and self is not Schedule.ONE_F_ONE_B:
            raise ValueError(f"extra warm-up applies to 1F1B only, not {self.value}")
        if not any(counts):
            return self.value
        if len(set(counts)) == 1:
            return f"{self.value}+{counts[0]}"
        label = f"{self.value}+{'/'.join(map(str, counts))}"
        parse_schedule(label)  # refuses counts that grow down the pipeline
        return label


Connections = int | Callable[[str, str, LinkKind], int]
"""TCP connections per communicating GPU pair: one number for all, or asked per pair."""


def communicating_pairs(
    placement: Mapping[Worker, tuple[str, ...]], dp: int, pp: int, tp: int
) -> list[tuple[str, str, LinkKind]]:
    """(gpu, gpu, kind) for every pair that exchanges tensors; kind says what flows."""
    pairs: list[tuple[str, str, LinkKind]] = []
    for replica in range(dp):
        for stage in range(pp):
            gpus = placement[(replica, stage)]
            if stage + 1 < pp and placement[(replica, stage + 1)] != gpus:  # else in memory
                nxt = placement[(replica, stage + 1)]
                pairs += [(gpus[t], nxt[t], LinkKind.PIPELINE) for t in range(tp)]
            if dp > 1 and (dp > 2 or replica == 0):
                peer = placement[((replica + 1) % dp, stage)]
                pairs += [(gpus[t], peer[t], LinkKind.ALLREDUCE) for t in range(tp)]
            for i in range(tp):
                for j in range(i + 1, tp):
                    pairs.append((gpus[i], gpus[j], LinkKind.TENSOR))
    return list(dict.fromkeys(pairs))  # a GPU's virtual stages share its pairs


def file_order_placement(
    topology: Topology, dp: int, pp: int, tp: int
) -> dict[Worker, tuple[str, ...]]:
    """GPUs taken in file order, a stage's replicas side by side: the naive placement."""
    gpus = [gpu.name for gpu in topology.gpus()]
    need = dp * pp * tp
    if need > len(gpus):
        raise InputError(
            f"dp {dp} x pp {pp} x tp {tp} needs {plural(need, 'GPU')}, the topology has "
            f"{len(gpus)}",
            topology.source,
            "job",
        )
    placement = {}
    for stage in range(pp):
        for replica in range(dp):
            first = (stage * dp + replica) * tp
            placement[(replica, stage)] = tuple(gpus[first : first + tp])
    return placement


def placement_shape(placement: Mapping[Worker, tuple[str, ...]]) -> tuple[int, int]:
    """(dp, pp) of a placement; it must name every (replica, stage) of that grid."""
    if not placement:
        raise ValueError("the placement is empty")
    dp = 1 + max(replica for replica, _ in placement)
    pp = 1 + max(stage for _, stage in placement)
    missing = [(r, s) for r in range(dp) for s in range(pp) if (r, s) not in placement]
    if missing or len(placement) != dp * pp:
        raise ValueError(f"the placement does not cover dp {dp} x pp {pp}: "
                         f"(replica, stage) {missing[:3]} missing or keys out of range")
    return dp, pp


def check_memory(topology: Topology, job: Job, placement: Mapping[Worker, tuple[str, ...]],
                 schedule: Schedule, extra_warmup: Warmup = 0) -> None:
    """Refuse a plan whose GPU does not hold its stages, naming where: parameters with
    optimizer state, and the activations its compute order holds at once."""
    dp, _ = placement_shape(placement)
    microbatches = job.microbatches_for(dp)
    _check_memory(topology, job, placement, compute_orders(
        job, placement, schedule, schedule.label(extra_warmup), microbatches))


def _check_memory(topology: Topology, job: Job, placement: Mapping[Worker, tuple[str, ...]],
                  orders: Mapping[tuple[str, ...], Sequence[Action]]) -> None:
    _, pp = placement_shape(placement)
    layers = split_layers(job.model.layers, pp)
    holds = stages_held(placement)
    needs: dict[tuple[int, ...], int] = {}  # a GPU's order follows from its stages
    for gpus, order in orders.items():
        stages = holds[gpus]
        gpu = topology.gpu(gpus[0]).type
        if stages not in needs:
            needs[stages] = gpu_memory_bytes(job, layers, stages, job.tp, order)
        need = needs[stages]
        if need > gpu.memory_bytes:
            held = sum(layers[s] for s in stages)
            what = f"stage {stages[0]}" if len(stages) == 1 else \
                f"stages {', '.join(map(str, stages))}"
            raise InputError(
                f"{what} ({plural(held, 'layer')}, tp {job.tp}) needs "
                f"{need / 2**30:.1f} GiB per GPU, {gpus[0]} ({gpu.name}) has "
                f"{gpu.memory_bytes / 2**30:.0f} GiB: use more stages or tensor parallelism",
                topology.source, "job")


def fits_memory(topology: Topology, job: Job, placement: Mapping[Worker, tuple[str, ...]],
                schedule: Schedule, extra_warmup: Warmup = 0) -> bool:
    """Whether every stage fits its GPUs' memory under this schedule (see check_memory)."""
    try:
        check_memory(topology, job, placement, schedule, extra_warmup)
    except InputError:
        return False
    return True


def dc_pipelines(topology: Topology, job: Job) -> dict[Worker, tuple[str, ...]]:
    """Whole pipelines inside datacenters, as many as fit (or `job.dp`), in file order:
    replicas that cross no WAN except to sync. Stages: `job.pp`, else as many as the
    smallest DC has GPUs (over tp), so one pipeline fits in every DC."""
    tp = job.tp
    smallest = min(dc.gpus for dc in topology.datacenters) // tp
    pp = job.pp if job.pp is not None else max(1, min(smallest, job.model.layers))
    placement: dict[Worker, tuple[str, ...]] = {}
    replica = 0
    for dc in topology.datacenters:
        hosts = dc.host_names()
        for first in range(0, dc.gpus - pp * tp + 1, pp * tp):
            if job.dp is not None and replica >= job.dp:
                break
            for stage in range(pp):
                start = first + stage * tp
                placement[(replica, stage)] = tuple(hosts[start : start + tp])
            replica += 1
    if replica == 0:
        raise InputError(f"a pipeline of pp {pp} x tp {tp} = {pp * tp} GPUs fits in no "
                         "datacenter", topology.source, "job.pp")
    if job.dp is not None and replica < job.dp:
        raise InputError(f"only {replica} whole pipelines of {pp * tp} GPUs fit inside "
                         f"datacenters, job asks dp {job.dp}", topology.source, "job.dp")
    return placement


def default_pp(topology: Topology, job: Job) -> int:
    """One stage per datacenter unless the job says otherwise (and never more than layers)."""
    return job.pp if job.pp is not None else min(len(topology.datacenters), job.model.layers)


def build_plan(
    policy: str,
    topology: Topology,
    job: Job,
    placement: Mapping[Worker, tuple[str, ...]],
    schedule: Schedule,
    *,
    extra_warmup: Warmup = 0,
    connections: Connections = 1,
    sharing: Sharing = Sharing.FAIR,
    dp_cells: tuple[tuple[int, ...], ...] = (),
    host_tcp: HostTcp | None = None,
    sends: Sends = Sends.EAGER,
    notes: Mapping[str, Any] | None = None,
    gradients: Collective | None = EVERY_STEP,
    order: TorchOrder | None = None,
    bucket_mb: float | None = None,
    sync_order: SyncOrder = SyncOrder.FAIR,
) -> Plan:
    """A Plan named after `policy` from a placement (which fixes dp and pp): every GPU's
    actions under the schedule, connection counts, and how pipeline traffic shares each
    WAN direction (gradient all-reduces always share fairly). Refuses what does not fit
    in memory. `sends`: whether stages wait for their sends as torch's schedules do.
    `gradients`: how replicas reduce their gradients before each step (None: they do not,
    as DiLoCo's workers step apart; see `cycled` for their syncs). `order`: for
    Schedule.TORCH_CSV, the compute order read from torch's CSV form. `bucket_mb`: reduce
    each stage's gradients in buckets of at most this many MiB, each starting as the
    backward has its values (torch DDP's; testbed.plan.buckets); None: in one all-reduce
    after the backward. `sync_order`: how all-reduces crossing the WAN share it."""
    dp, pp = placement_shape(placement)
    label = schedule.label(extra_warmup)
    microbatches = job.microbatches_for(dp)
    if microbatches > MAX_MICROBATCHES:  # from global_batch: job.microbatches is checked
        raise InputError(f"global_batch {job.global_batch} at dp {dp} and microbatch_size "
                         f"{job.microbatch_size} is {microbatches:,} microbatches per replica, "
                         f"more than testbed's limit of {MAX_MICROBATCHES:,}", job.source,
                         "job.global_batch")
    if pp > job.model.layers:
        raise InputError(f"{plural(pp, 'stage')} need as many layers, the model has "
                         f"{job.model.layers}", job.source, "job.model.layers")
    orders = compute_orders(job, placement, schedule, label, microbatches, order)
    _check_memory(topology, job, placement, orders)
    layers = split_layers(job.model.layers, pp)
    buckets = {stage: 1 if gradients is None else len(
        in_buckets(job, layers, stage, gradients, bucket_mb)) for stage in range(pp)}
    count = connections if callable(connections) else _every_pair(connections)
    held = stages_held(placement)
    # one list per set of stages held, shared by its replicas' GPUs (what a GPU does
    # depends on its stages alone), so that what reads plans can tell equal lists by identity
    per_stages: dict[tuple[int, ...], tuple[Action, ...]] = {}
    actions: dict[str, tuple[Action, ...]] = {}
    for gpus, computes in orders.items():
        stages = held[gpus]
        if stages not in per_stages:
            per_stages[stages] = tuple(
                lower(computes, stages, pp, microbatches, dp, sends, gradients, buckets)
                if schedule.from_torch else
                stage_actions(label, stages[0], pp, microbatches, dp, sends, gradients,
                              buckets[stages[0]]))
        for gpu in gpus:
            actions[gpu] = per_stages[stages]
    dc_of = {gpu: topology.dc_of(gpu) for gpus in placement.values() for gpu in gpus}
    conns: dict[tuple[str, str], int] = {}
    shared: dict[tuple[str, str], Sharing] = {}
    for a, b, kind in communicating_pairs(placement, dp, pp, job.tp):
        conns[pair_key(a, b)] = count(a, b, kind)
        dc_a, dc_b = dc_of[a], dc_of[b]
        if dc_a != dc_b:
            link_sharing = sharing if kind is LinkKind.PIPELINE else Sharing.FAIR
            for direction in ((dc_a, dc_b), (dc_b, dc_a)):
                if shared.get(direction) is not Sharing.ARBITRATED:
                    shared[direction] = link_sharing
    return Plan(
        policy=policy,
        dp=dp,
        pp=pp,
        microbatches=microbatches,
        microbatch_size=job.microbatch_size,
        layers=layers,
        placement=dict(placement),
        actions=actions,
        connections=conns,
        sharing=shared,
        tp=job.tp,
        dp_cells=dp_cells,
        host_tcp=host_tcp or HostTcp(),
        notes=dict(notes or {}),
        sync_order=sync_order,
    )


def virtual_placement(placement: Mapping[Worker, tuple[str, ...]], schedule: Schedule,
                      virtual: int) -> dict[Worker, tuple[str, ...]]:
    """Several stages per GPU: `placement` names each replica's GPUs in pipeline order as
    its stages 0, 1, ... (rank r: the r-th GPU of the pipeline, as torch calls it); each
    rank then holds the `virtual` stages torch's mapping gives it under `schedule` (rank g
    of P: g, g + P, ... looped; g and 2P - 1 - g V-shaped)."""
    if virtual == 1:
        return dict(placement)
    if not schedule.from_torch:
        raise ValueError(f"{schedule.value} runs one stage per GPU")
    dp, ranks = placement_shape(placement)
    mapping = stage_ranks(schedule.value, ranks, virtual)
    return {(r, s): placement[(r, rank)] for r in range(dp) for s, rank in mapping.items()}


def stages_held(placement: Mapping[Worker, tuple[str, ...]]
                ) -> dict[tuple[str, ...], tuple[int, ...]]:
    """The stages each tensor-parallel group holds, in order (one pass over the placement:
    a plan at 32,768 GPUs has thousands of groups)."""
    held: dict[tuple[str, ...], list[int]] = {}
    for (_, stage), gpus in sorted(placement.items()):
        held.setdefault(gpus, []).append(stage)
    return {gpus: tuple(stages) for gpus, stages in held.items()}


def compute_orders(job: Job, placement: Mapping[Worker, tuple[str, ...]], schedule: Schedule,
                   label: str, microbatches: int, given: TorchOrder | None = None
                   ) -> dict[tuple[str, ...], tuple[Action, ...]]:
    """Each GPU's compute order under the schedule (per tensor-parallel group, in stage
    order): F and B, and I, W and OVERLAP_F_B where torch's schedule has them (`given`:
    torch's order as read from its CSV form)."""
    _, pp = placement_shape(placement)
    held = stages_held(placement)
    if not schedule.from_torch:
        if any(len(stages) > 1 for stages in held.values()):
            raise ValueError(f"{schedule.value} runs one stage per GPU")
        per_stage = {stages: tuple(schedule_compute(label, stages[0], pp, microbatches))
                     for stages in set(held.values())}
        return {gpus: per_stage[stages] for gpus, stages in held.items()}
    virtual = len(next(iter(held.values())))
    order = given or checked_torch_order(job, schedule.value, pp // virtual, virtual,
                                         microbatches)
    out: dict[tuple[str, ...], tuple[Action, ...]] = {}
    for gpus, stages in held.items():
        rank = order.stage_rank[stages[0]]
        if tuple(stages) != order.stages_of(rank):
            raise ValueError(f"{gpus[0]} holds stages {stages}, {schedule.value} puts "
                             f"{list(order.stages_of(rank))} on one GPU (see virtual_placement)")
        out[gpus] = order.compute[rank]
    return out


def _every_pair(n: int) -> Callable[[str, str, LinkKind], int]:
    return lambda _a, _b, _kind: n
