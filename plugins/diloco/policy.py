"""DiLoCo and Streaming DiLoCo: whole replicas per datacenter (pipelined inside one where
the model needs it), local inner steps, and every H steps an all-reduce of parameter
deltas across datacenters followed by an outer Nesterov step.

- DiLoCo (Douillard et al., arXiv 2311.08105): every replica syncs all its parameters
  every H inner steps; outer SGD with Nesterov momentum, learning rate 0.7, momentum 0.9,
  H = 500 (the paper's defaults).
- Streaming DiLoCo (Douillard et al., arXiv 2501.18512): fragments of strided blocks sync
  in turn (peak bandwidth / fragments), fragment k after inner step ceil((k + 1) H / N) - 1
  of every H, each sync overlapped with `overlap` inner steps and merged into the local
  parameters with mixing factor 0.5; H = 100 and fragments of 3 blocks in the paper,
  whose outer gradients cross as 4-bit floats (E3M0).
- Eager updates (Kale, Douillard, Donchev, arXiv 2502.12996, Algorithm 3), for both: a
  sync overlaps the whole next outer step (H inner steps) and each outer step takes at
  once the replica's own fresh deltas with the others' of the sync before
  (testbed.plan.model.OuterOptimizer.eager).

A sync's deltas reduce in buckets (`bucket_mb`, torch DDP's 25 MiB by default): where a
replica reduces no gradients of its own (one per datacenter), each bucket starts in the
backward of the sync's step, as that backward has its layers' gradients and they took
their inner step, overlapping the reduction with the rest of the backward as the
Streaming DiLoCo paper's simulation does. The outer parameters and momentum live in host
memory, as OpenDiLoCo (arXiv 2407.07852) keeps them: they are not counted against GPU
memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.policy.api import (
    DDP_BUCKET_MB,
    Action,
    Collective,
    InputError,
    Iteration,
    Job,
    LinkKind,
    Op,
    OuterOptimizer,
    Plan,
    PlanningContext,
    Reduces,
    Schedule,
    Scope,
    SyncOrder,
    Tail,
    Topology,
    TrainingPolicy,
    at_least_one,
    bucket_size,
    build_plan,
    cycled,
    dc_pipelines,
    fraction,
    in_buckets,
    non_negative_int,
    on_off,
    one_of,
    positive,
    setting,
)

BITS = {"32": "fp32", "16": "bf16", "8": "int8", "4": "fp4"}
"""`outer_bits` to payload: 4 is the Streaming DiLoCo paper's 4-bit float (fp4, E3M0);
int8 and int4 are blockwise absmax integers (results name the format: `plan.payloads`)."""


def _bits(text: str) -> str:
    if text in (*BITS.values(), "int4"):
        return text
    return BITS[one_of(*BITS, *BITS.values(), "int4")(text)]


CONNECTIONS_HELP = ("TCP connections per cross-DC pair of replicas for the syncs (1, as the "
                    "baselines; one flow is capped at window / RTT)")
BUCKET_HELP = ("bucket size in MiB of the inner gradients' and the syncs' all-reduces, each "
               "starting as the backward has its values (torch DDP's default 25); 0: one "
               "all-reduce, after the step")
ORDER_HELP = ("how syncs crossing the WAN share it: fair (every flow at once) or first-layers "
              "(one transfer at a time, the first layers' first)")
EAGER_HELP = ("eager updates (arXiv 2502.12996): a sync overlaps the whole next outer step, "
              "each outer step taking the replica's fresh deltas with the others' previous")


@dataclass(frozen=True)
class DiLoCoSettings:
    inner_steps: int = setting(500, "H, inner steps per sync (the paper: 500)", at_least_one)
    outer_lr: float = setting(0.7, "outer SGD learning rate (the paper: 0.7)", positive)
    outer_momentum: float = setting(0.9, "outer Nesterov momentum (the paper: 0.9)",
                                    fraction)
    outer_bits: str = setting("bf16", "bits per synced delta: 32, 16 (bf16, as OpenDiLoCo "
                              "found lossless), 8 (int8), 4 (fp4, E3M0) or int4", _bits)
    eager: bool = setting(False, EAGER_HELP, on_off)
    bucket_mb: float = setting(DDP_BUCKET_MB, BUCKET_HELP, bucket_size)
    sync_order: str = setting("fair", ORDER_HELP, one_of("fair", "first-layers"))
    connections: int = setting(1, CONNECTIONS_HELP, at_least_one)


@dataclass(frozen=True)
class StreamingSettings:
    inner_steps: int = setting(100, "H, inner steps between two syncs of one fragment "
                               "(the paper: 100)", at_least_one)
    fragments: int = setting(0, "fragments synced in turn; 0: one per 3 blocks, as the "
                             "paper's", non_negative_int)
    overlap: int = setting(1, "inner steps a fragment's sync runs behind (the paper: 1 to 5; "
                           "less than H)", non_negative_int)
    mixing: float = setting(0.5, "weight the local parameters keep when an overlapped sync "
                            "lands (the paper's alpha: 0.5)", fraction)
    outer_lr: float = setting(0.7, "outer SGD learning rate (DiLoCo's 0.7)", positive)
    outer_momentum: float = setting(0.9, "outer Nesterov momentum (DiLoCo's 0.9)", fraction)
    outer_bits: str = setting("bf16", "bits per synced delta: 32, 16, 8 (int8), 4 (fp4, the "
                              "paper's E3M0) or int4", _bits)
    eager: bool = setting(False, EAGER_HELP + " (overlap and mixing then unused)", on_off)
    bucket_mb: float = setting(DDP_BUCKET_MB, BUCKET_HELP, bucket_size)
    sync_order: str = setting("fair", ORDER_HELP, one_of("fair", "first-layers"))
    connections: int = setting(1, CONNECTIONS_HELP, at_least_one)


def inner_plan(name: str, topology: Topology, job: Job, connections: int, bucket_mb: float,
               sync_order: str) -> Plan:
    """Replicas inside datacenters that step on their own gradients, reduced among the
    replicas of one datacenter where it has several (a DiLoCo worker is itself data
    parallel); `connections` per pair of replicas in different DCs."""
    placement = dc_pipelines(topology, job)
    per_dc: dict[str, int] = {}
    for (_, stage), gpus in placement.items():
        if stage == 0:
            dc = topology.dc_of(gpus[0])
            per_dc[dc] = per_dc.get(dc, 0) + 1
    gradients = Collective(scope=Scope.DC) if max(per_dc.values()) > 1 else None

    def count(a: str, b: str, kind: LinkKind) -> int:
        across = kind is LinkKind.ALLREDUCE and topology.dc_of(a) != topology.dc_of(b)
        return connections if across else 1

    return build_plan(name, topology, job, placement, Schedule.ONE_F_ONE_B,
                      gradients=gradients, connections=count, bucket_mb=bucket_mb or None,
                      sync_order=SyncOrder(sync_order))


@dataclass(frozen=True)
class SyncSchedule:
    """When each fragment syncs in a cycle of H inner steps."""

    steps: int
    fragments: int
    overlap: int
    eager: bool

    def start(self, fragment: int) -> int:
        """The iteration of the cycle after whose step (or in whose backward) the
        fragment's sync starts: ceil((k + 1) H / N) - 1, the fragments spread evenly
        over the H steps as the paper's, the last on the H-th (DiLoCo's one fragment);
        more fragments than steps share steps."""
        return -(-(fragment + 1) * self.steps // self.fragments) - 1


def sync_plan(inner: Plan, job: Job, schedule: SyncSchedule, payload: str, bucket_mb: float,
              outer: OuterOptimizer) -> Plan:
    """The cycle of `schedule.steps` iterations syncing every fragment once, and the
    opening cycle where a sync lands (or an eager one waits) in the next cycle."""
    steps, overlap = schedule.steps, schedule.overlap
    in_backward = bucket_mb > 0 and not any(
        a.op.is_collective for actions in inner.actions.values() for a in actions)
    tails: list[dict[int, Iteration]] = [{} for _ in range(steps)]
    opening: list[dict[int, Iteration]] = [{} for _ in range(steps)]

    def add(at: list[dict[int, Iteration]], iteration: int, stage: int, part: Iteration) -> None:
        was = at[iteration].get(stage, Iteration())
        at[iteration][stage] = Iteration(was.before + part.before,
                                         was.in_backward + part.in_backward,
                                         was.after + part.after)

    for k in range(schedule.fragments):
        start = schedule.start(k)
        outer_step = Collective(Reduces.DELTAS, k, schedule.fragments)
        for stage in range(inner.pp):
            parts = in_buckets(job, inner.layers, stage,
                               Collective(Reduces.DELTAS, k, schedule.fragments, payload),
                               bucket_mb or None)
            starts = tuple(Action(stage, Op.ALLREDUCE_START, None, c) for c in parts)
            waits = tuple(Action(stage, Op.ALLREDUCE_WAIT, None, c) for c in parts)
            step = (Action(stage, Op.OUTER_STEP, None, outer_step),)
            if schedule.eager:  # the sync before ends first; the fresh one starts now
                fresh = Iteration(in_backward=starts, after=step) if in_backward else \
                    Iteration(after=starts + step)
                add(opening, start, stage, fresh)
                add(tails, start, stage, Iteration(before=waits) if in_backward else
                    Iteration(after=waits))
                add(tails, start, stage, fresh)
                continue
            began = Iteration(in_backward=starts) if in_backward else Iteration(after=starts)
            for at in (tails, opening):
                add(at, start, stage, began)
            land = start + overlap
            add(tails, land % steps, stage, Iteration(after=waits + step))
            if land < steps:  # in the first cycle a sync landing in the next lands nowhere
                add(opening, land, stage, Iteration(after=waits + step))
    return cycled(inner, [_tail(t) for t in tails], outer,
                  opening=[_tail(t) for t in opening])


def _tail(by_stage: dict[int, Iteration]) -> Tail:
    def tail(stage: int) -> Sequence[Action] | Iteration:
        return by_stage.get(stage, Iteration())

    return tail


class DiLoCoPolicy(TrainingPolicy):
    name = "diloco"
    summary = ("DiLoCo: replicas per DC take H local steps, then average parameter deltas "
               "across DCs and take an outer Nesterov step (arXiv 2311.08105)")
    settings_type: ClassVar[type[Any]] = DiLoCoSettings
    settings: DiLoCoSettings

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        s = self.settings
        inner = inner_plan(self.name, topology, job, s.connections, s.bucket_mb, s.sync_order)
        return sync_plan(inner, job, SyncSchedule(s.inner_steps, 1, 0, s.eager), s.outer_bits,
                         s.bucket_mb, OuterOptimizer(s.outer_lr, s.outer_momentum,
                                                     eager=s.eager))


class StreamingDiLoCoPolicy(TrainingPolicy):
    name = "streaming-diloco"
    summary = ("Streaming DiLoCo: fragments synced in turn, overlapped with inner steps, "
               "optionally 4-bit floats (arXiv 2501.18512)")
    settings_type: ClassVar[type[Any]] = StreamingSettings
    settings: StreamingSettings

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        s = self.settings
        layers = job.model.layers
        fragments = s.fragments or max(1, layers // 3)
        if fragments > layers:
            raise InputError(f"{fragments} fragments of a {layers}-layer model: a fragment "
                             "holds whole blocks, at least one (the paper's hold 3)",
                             "--option", "fragments")
        if not s.eager and s.overlap >= s.inner_steps:
            raise InputError(
                f"overlap {s.overlap} of inner_steps {s.inner_steps}: a fragment syncs every "
                f"{s.inner_steps} steps, its next sync would start before this one lands "
                "(eager=on overlaps a whole outer step)", "--option", "overlap")
        inner = inner_plan(self.name, topology, job, s.connections, s.bucket_mb, s.sync_order)
        overlap = 0 if s.eager else s.overlap
        mixing = s.mixing if overlap else 0.0
        return sync_plan(inner, job, SyncSchedule(s.inner_steps, fragments, overlap, s.eager),
                         s.outer_bits, s.bucket_mb,
                         OuterOptimizer(s.outer_lr, s.outer_momentum, mixing=mixing,
                                        eager=s.eager))
