"""The Plan: where each (replica, stage) runs, what each GPU does in order, how links are used.

Actions (testbed.plan.action) follow torch.distributed.pipelining's text form. A GPU may
hold several stages of its replica (virtual stages: torch's interleaved and V-shaped
schedules); its list then names the actions of all of them.

A plan is one iteration's program, repeated, or a cycle of programs (`programs`, `cycle`):
DiLoCo steps locally for H iterations and syncs in the H-th.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NotRequired, TypedDict

from testbed.common.codec import JsonObject
from testbed.errors import InputError
from testbed.plan.action import Action as Action
from testbed.plan.action import Op as Op
from testbed.plan.collective import Reduces, payload_format


class HostTcpRecord(TypedDict, total=False):
    """A plan's host TCP settings as results.json records them: those given."""

    slow_start_after_idle: bool
    buffer_bytes: int


class OuterRecord(TypedDict):
    """The outer optimizer as results.json records it."""

    lr: float
    momentum: float
    nesterov: bool
    mixing: float
    eager: NotRequired[bool]


class PlanRecord(TypedDict):
    """The plan as a failure's record keeps it, before and after a replan."""

    policy: str
    dp: int
    pp: int
    microbatches: int
    layers_per_stage: list[int]
    placement: dict[str, list[str]]
    """GPUs of each "replica,stage"."""


class PlanSummary(PlanRecord):
    """The `plan` block of results.json."""

    tp: int
    microbatch_size: int
    connections: dict[str, int]
    """TCP connections per "a:b" GPU pair."""
    sharing: dict[str, str]
    """Each "source>destination" DC pair's Sharing."""
    sync_order: NotRequired[str]
    dp_cells: list[list[int]]
    host_tcp: HostTcpRecord
    notes: JsonObject
    """The policy's own notes (Plan.notes): free-form, each policy's format."""
    period: int
    opening: NotRequired[list[int]]
    stages_per_gpu: NotRequired[int]
    outer: NotRequired[OuterRecord]
    payloads: NotRequired[dict[str, str]]


@dataclass(frozen=True)
class HostTcp:
    """TCP settings a plan needs on the hosts it uses, over the topology's own (None keeps
    the topology's). Both backends apply them to every host of the plan's DCs, as a
    deployment would configure its machines."""

    slow_start_after_idle: bool | None = None
    """Off keeps a connection's window across the idle gaps between its turns on a link."""
    buffer_bytes: int | None = None
    """Socket buffer maximum (rmem and wmem): the largest window one connection can use."""

    def __bool__(self) -> bool:
        return self.slow_start_after_idle is not None or self.buffer_bytes is not None

    def to_dict(self) -> HostTcpRecord:
        """The settings given (not None), by name, as results.json records them."""
        out: HostTcpRecord = {}
        if self.slow_start_after_idle is not None:
            out["slow_start_after_idle"] = self.slow_start_after_idle
        if self.buffer_bytes is not None:
            out["buffer_bytes"] = self.buffer_bytes
        return out


class Sharing(StrEnum):
    """How concurrent transfers share one WAN link direction."""

    FAIR = "fair"
    """TCP fair share: every flow at once."""
    ARBITRATED = "arbitrated"
    """One transfer at a time, in the order the policy's `next_transfer` chooses."""


class SyncOrder(StrEnum):
    """How all-reduces whose rings cross the WAN share a link direction."""

    FAIR = "fair"
    """TCP fair share: every ring's flows at once."""
    FIRST_LAYERS = "first-layers"
    """One transfer at a time, the first layers' first (testbed.policy.base.
    first_layers_first): what the next forward needs soonest."""
    POLICY = "policy"
    """One transfer at a time, in the order the policy's `next_transfer` chooses."""

    @property
    def arbitrated(self) -> bool:
        """Whether the arbiter grants the link one transfer at a time."""
        return self is not SyncOrder.FAIR


@dataclass(frozen=True)
class OuterOptimizer:
    """How OUTER_STEP moves the outer parameters (DiLoCo, arXiv 2311.08105: SGD with
    Nesterov momentum on the averaged deltas, learning rate 0.7, momentum 0.9)."""

    lr: float = 0.7
    """Outer learning rate."""
    momentum: float = 0.9
    """Outer momentum (0: plain averaging at lr 1)."""
    nesterov: bool = True
    """Nesterov momentum rather than heavy ball."""
    mixing: float = 0.0
    """Weight the local parameters keep when the outer ones arrive after inner steps went
    on (Streaming DiLoCo's overlap, arXiv 2501.18512: alpha, 0.5 there); 0 replaces them."""
    eager: bool = False
    """Eager updates (Kale, Douillard, Donchev, arXiv 2502.12996, Algorithm 3): a sync
    overlaps the whole next outer step's inner phase; each outer step takes at once this
    replica's own fresh deltas mixed with the others' of the sync before, which has
    ended by then: (own fresh + sum over the others of their previous) / M. An OUTER_STEP
    then follows its fragment's START of the fresh sync, and the sync before is waited
    for first."""

    def to_dict(self) -> OuterRecord:
        """Its fields by name, as results.json records them."""
        out: OuterRecord = {"lr": self.lr, "momentum": self.momentum,
                            "nesterov": self.nesterov, "mixing": self.mixing}
        if self.eager:
            out["eager"] = True
        return out


Worker = tuple[int, int]
"""(replica, stage)."""

Program = Mapping[str, tuple[Action, ...]]
"""One iteration's ordered actions per GPU."""


@dataclass(frozen=True)
class Plan:
    """What a training policy decides, as both backends run it: where each (replica, stage)
    runs, each GPU's ordered actions, TCP connections, WAN sharing. Policies make one with
    `build_plan` (and `cycled`); the validator checks it before anything runs."""

    policy: str
    """The policy that made it (its name)."""
    dp: int
    """Data-parallel replicas."""
    pp: int
    """Pipeline stages, each with its layers: under virtual stages, a multiple of the GPUs
    in a pipeline (`gpus_per_pipeline`)."""
    microbatches: int
    """Microbatches per replica per iteration."""
    microbatch_size: int
    """Sequences per microbatch."""
    layers: tuple[int, ...]
    """Transformer layers per stage."""
    placement: Mapping[Worker, tuple[str, ...]]
    """GPUs of each (replica, stage); more than one when tensor parallel. Stages of one
    replica may share their GPUs (virtual stages: GPU g of a looped pipeline holds stages
    g, g + P, ...; of a V-shaped one g and 2P - 1 - g)."""
    actions: Mapping[str, tuple[Action, ...]]
    """Ordered actions per GPU (of all the stages it holds); every GPU of a
    tensor-parallel group has the same list."""
    connections: Mapping[tuple[str, str], int]
    """TCP connections per communicating GPU pair (names sorted)."""
    sharing: Mapping[tuple[str, str], Sharing]
    """Per directed (source DC, destination DC) pair the plan sends over: pipeline
    traffic as the policy shares it, a gradient all-reduce's fairly (testbed.plan.build)."""
    tp: int = 1
    """GPUs per tensor-parallel group (each stage of each replica)."""
    dp_cells: tuple[tuple[int, ...], ...] = ()
    """Groups of replicas that take turns on the same WAN links."""
    host_tcp: HostTcp = HostTcp()
    """TCP settings the plan needs on its hosts, over the topology's."""
    notes: Mapping[str, Any] = field(default_factory=dict)
    """Free-form facts a policy records: candidates considered, why one won."""
    programs: tuple[Program, ...] = ()
    """Iteration programs besides `actions` (which is program 0), for plans whose
    iterations differ."""
    cycle: tuple[int, ...] = ()
    """The program each iteration of a cycle runs (0 is `actions`, i is programs[i - 1]);
    iteration n runs cycle[n % len(cycle)]. Empty: every iteration runs `actions`."""
    opening: tuple[int, ...] = ()
    """The program each iteration of the run's first cycle runs, where that cycle differs
    (a sync that crosses the cycle's end has nothing to wait for, nor an outer step to
    take, in the first): as long as `cycle`. Empty: the first cycle is as the others."""
    outer: OuterOptimizer = OuterOptimizer()
    """What OUTER_STEP actions do, where the plan has any."""
    sync_order: SyncOrder = SyncOrder.FAIR
    """How all-reduces crossing the WAN share a link direction (`sharing` says how
    pipeline traffic does)."""

    @property
    def has_outer_steps(self) -> bool:
        """Whether any GPU runs an OUTER_STEP (a DiLoCo-like plan)."""
        return any(a.op is Op.OUTER_STEP for actions in self.action_lists() for a in actions)

    @property
    def keeps_outer_model(self) -> bool:
        """Whether every stage syncs deltas into outer parameters (a DiLoCo-family plan):
        the model such a run keeps is the outer one, not its replicas' local ones."""
        syncing = {a.stage for actions in self.action_lists()
                   for a in actions if a.op.is_collective and a.op is not Op.OUTER_STEP
                   and a.subject.reduces is Reduces.DELTAS}
        return bool(syncing) and syncing == set(range(self.pp))

    @property
    def period(self) -> int:
        """Iterations in one cycle."""
        return len(self.cycle) or 1

    def all_programs(self) -> tuple[Program, ...]:
        """`actions` and then `programs`: every iteration program, numbered as `cycle`
        numbers them."""
        return (self.actions, *self.programs)

    def action_lists(self) -> list[tuple[Action, ...]]:
        """Every GPU's action list of every program, each list once: the GPUs of a stage
        and the replicas alike share one (build_plan), so a plan of thousands of GPUs has
        a handful, where going by GPU would read each thousands of times."""
        return list({id(actions): actions for program in self.all_programs()
                     for actions in program.values()}.values())

    def program_of(self, iteration: int) -> int:
        """Which program iteration `iteration` runs."""
        if iteration < len(self.opening):
            return self.opening[iteration]
        return self.cycle[iteration % len(self.cycle)] if self.cycle else 0

    def actions_at(self, iteration: int) -> Program:
        """Every GPU's actions in iteration `iteration`."""
        return self.all_programs()[self.program_of(iteration)]

    def steady_actions_at(self, position: int) -> Program:
        """Every GPU's actions at `position` of a cycle after the first (what the plan
        does for good, its opening aside)."""
        return self.all_programs()[self.cycle[position % len(self.cycle)]
                                   if self.cycle else 0]

    def gpus_of(self, replica: int, stage: int) -> tuple[str, ...]:
        """The GPUs of one (replica, stage): `tp` of them."""
        return self.placement[(replica, stage)]

    def worker_of(self, gpu: str) -> Worker:
        """The (replica, stage) a GPU runs; its first stage if it holds several."""
        for worker, gpus in self.workers():
            if gpu in gpus:
                return worker
        raise KeyError(gpu)

    def stages_of(self, gpu: str) -> tuple[int, ...]:
        """The stages a GPU holds, in order: one, or several under virtual stages."""
        return self._stages_by_gpu.get(gpu, ())

    @functools.cached_property
    def _stages_by_gpu(self) -> dict[str, tuple[int, ...]]:
        found: dict[str, list[int]] = {}
        for (_, stage), gpus in self.workers():
            for gpu in gpus:
                found.setdefault(gpu, []).append(stage)
        return {gpu: tuple(stages) for gpu, stages in found.items()}

    @property
    def stages_per_gpu(self) -> int:
        """1, or the virtual stages every GPU holds (the validator sees that all hold as
        many)."""
        return max(map(len, self._stages_by_gpu.values()), default=1)

    @property
    def gpus_per_pipeline(self) -> int:
        """What `--pp` and the job's `pp` count: `pp` over the stages per GPU."""
        return self.pp // self.stages_per_gpu

    @property
    def features(self) -> frozenset[Feature]:
        """What of torch's schedule language the plan uses beyond one stage per GPU and
        whole backwards (a backend refuses what it does not run: `refuse_features`)."""
        ops = {leaf.op for actions in self.action_lists() for a in actions
               for leaf in (a, *a.parts)}
        return frozenset(
            {Feature.VIRTUAL} if self.stages_per_gpu > 1 else set()) | frozenset(
            feature for feature, uses in _FEATURE_OPS.items() if uses & ops)

    def workers(self) -> Iterator[tuple[Worker, tuple[str, ...]]]:
        """Each (replica, stage) with its GPUs, in that order."""
        yield from sorted(self.placement.items())

    def lead_gpu(self, replica: int, stage: int) -> str:
        """The first of one (replica, stage)'s GPUs."""
        return self.placement[(replica, stage)][0]

    def used_gpus(self) -> list[str]:
        """Every GPU of the plan once, in stage order."""
        return list(dict.fromkeys(gpu for _, gpus in self.workers() for gpu in gpus))

    def connections_between(self, a: str, b: str) -> int:
        """TCP connections between GPUs a and b, either way round (1 where the plan sets none)."""
        return self.connections.get(pair_key(a, b), 1)

    def stage_dcs(self, dc_of: Any) -> list[set[str]]:
        """DCs that host each stage, given a function from GPU to DC."""
        out: list[set[str]] = [set() for _ in range(self.pp)]
        for (_, stage), gpus in self.placement.items():
            out[stage].update(dc_of(gpu) for gpu in gpus)
        return out

    def summary(self) -> PlanSummary:
        """The `plan` block of results.json."""
        out: PlanSummary = {
            "policy": self.policy,
            "dp": self.dp,
            "pp": self.pp,
            "tp": self.tp,
            "microbatches": self.microbatches,
            "microbatch_size": self.microbatch_size,
            "layers_per_stage": list(self.layers),
            "placement": {f"{r},{s}": list(g) for (r, s), g in sorted(self.placement.items())},
            "connections": {f"{a}:{b}": n for (a, b), n in sorted(self.connections.items())},
            "sharing": {f"{a}>{b}": s.value for (a, b), s in sorted(self.sharing.items())},
            "dp_cells": [list(cell) for cell in self.dp_cells],
            "host_tcp": self.host_tcp.to_dict(),
            "notes": dict(self.notes),
            "period": self.period,
        }
        if self.sync_order is not SyncOrder.FAIR:
            out["sync_order"] = self.sync_order.value
        if self.opening:
            out["opening"] = list(self.opening)
        if self.stages_per_gpu > 1:
            out["stages_per_gpu"] = self.stages_per_gpu
        if self.has_outer_steps:
            out["outer"] = self.outer.to_dict()
        if self.payloads:
            out["payloads"] = self.payloads
        return out

    @property
    def payloads(self) -> dict[str, str]:
        """Each payload its collectives name (the job's dtype left out), in words."""
        named = sorted({a.subject.payload for actions in self.action_lists() for a in actions
                        if a.op.is_collective and a.subject.payload})
        return {payload: payload_format(payload) for payload in named}


class Feature(StrEnum):
    """Parts of torch's schedule language a backend may not run yet."""

    VIRTUAL = "virtual stages (several stages per GPU)"
    SPLIT_BACKWARD = "split backwards (I and W)"
    OVERLAP = "overlapped forward and backward (OVERLAP_F_B)"


_FEATURE_OPS = {Feature.SPLIT_BACKWARD: {Op.I, Op.W}, Feature.OVERLAP: {Op.OVERLAP_F_B}}


def refuse_features(plan: Plan, runs: frozenset[Feature], backend: str,
                    where: str | None = None) -> None:
    """InputError naming what of the plan `backend` does not run (it runs `runs`), located
    at `where` (the plan's file; by default the policy that made it)."""
    missing = sorted(plan.features - runs)
    if missing:
        raise InputError(f"its plan uses {' and '.join(missing)}: not yet run by {backend}",
                         where or f"-p {plan.policy}")


def pair_key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def split_layers(layers: int, stages: int) -> tuple[int, ...]:
    """As even as possible; the first stages take the remainder."""
    base, extra = divmod(layers, stages)
    return tuple(base + (1 if s < extra else 0) for s in range(stages))
