"""DiLoCo and Streaming DiLoCo: whole replicas per datacenter (pipelined inside one where
the model needs it), local inner steps, and every H steps an all-reduce of parameter
deltas across datacenters followed by an outer Nesterov step.

- DiLoCo (Douillard et al., arXiv 2311.08105): every replica syncs all its parameters
  every H inner steps; outer SGD with Nesterov momentum, learning rate 0.7, momentum 0.9,
  H = 500 (the paper's defaults).
- Streaming DiLoCo (Douillard et al., arXiv 2501.18512): fragments of strided blocks sync
  in turn at staggered iterations (peak bandwidth / fragments), each sync overlapped with
  `overlap` inner steps and merged into the local parameters with mixing factor 0.5;
  H = 100 and fragments of 3 blocks in the paper.

The outer parameters and momentum live in host memory, as OpenDiLoCo (arXiv 2407.07852)
keeps them: they are not counted against GPU memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.policy.api import (
    Action,
    Collective,
    InputError,
    Job,
    LinkKind,
    Op,
    OuterOptimizer,
    Plan,
    PlanningContext,
    Reduces,
    Schedule,
    Scope,
    Tail,
    Topology,
    TrainingPolicy,
    at_least_one,
    build_plan,
    cycled,
    dc_pipelines,
    fraction,
    non_negative_int,
    one_of,
    positive,
    setting,
)

BITS = {"32": "fp32", "16": "bf16", "8": "int8", "4": "int4"}
"""`outer_bits` to payload: int8 and int4 are blockwise absmax integers, not the 4-bit
floats (FP4, E3M0) the Streaming DiLoCo paper sends; results name the format
(`plan.payloads`)."""


def _bits(text: str) -> str:
    if text in BITS.values():
        return text
    return BITS[one_of(*BITS, *BITS.values())(text)]


def _nothing(stage: int) -> Sequence[Action]:
    return ()


CONNECTIONS_HELP = ("TCP connections per cross-DC pair of replicas for the syncs (1, as the "
                    "baselines; one flow is capped at window / RTT)")


@dataclass(frozen=True)
class DiLoCoSettings:
    inner_steps: int = setting(500, "H, inner steps per sync (the paper: 500)", at_least_one)
    outer_lr: float = setting(0.7, "outer SGD learning rate (the paper: 0.7)", positive)
    outer_momentum: float = setting(0.9, "outer Nesterov momentum (the paper: 0.9)",
                                    fraction)
    outer_bits: str = setting("bf16", "bits per synced delta: 32, 16 (bf16, as OpenDiLoCo "
                              "found lossless), 8 or 4 (int8/int4 blockwise integers)", _bits)
    connections: int = setting(1, CONNECTIONS_HELP, at_least_one)


@dataclass(frozen=True)
class StreamingSettings:
    inner_steps: int = setting(100, "H, inner steps between two syncs of one fragment "
                               "(the paper: 100)", at_least_one)
    fragments: int = setting(0, "fragments synced in turn; 0: one per 3 blocks, as the "
                             "paper's", non_negative_int)
    overlap: int = setting(1, "inner steps a fragment's sync runs behind (the paper: 1 to 5)",
                           non_negative_int)
    mixing: float = setting(0.5, "weight the local parameters keep when an overlapped sync "
                            "lands (the paper's alpha: 0.5)", fraction)
    outer_lr: float = setting(0.7, "outer SGD learning rate (DiLoCo's 0.7)", positive)
    outer_momentum: float = setting(0.9, "outer Nesterov momentum (DiLoCo's 0.9)", fraction)
    outer_bits: str = setting("bf16", "bits per synced delta: 32, 16, 8 or 4 (int8/int4 "
                              "blockwise integers; the paper sends 4-bit floats, E3M0)", _bits)
    connections: int = setting(1, CONNECTIONS_HELP, at_least_one)


def inner_plan(name: str, topology: Topology, job: Job, connections: int = 1) -> Plan:
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
                      gradients=gradients, connections=count)


class DiLoCoPolicy(TrainingPolicy):
    name = "diloco"
    summary = ("DiLoCo: replicas per DC take H local steps, then average parameter deltas "
               "across DCs and take an outer Nesterov step (arXiv 2311.08105)")
    settings_type: ClassVar[type[Any]] = DiLoCoSettings
    settings: DiLoCoSettings

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        inner = inner_plan(self.name, topology, job, self.settings.connections)
        deltas = Collective(Reduces.DELTAS, payload=self.settings.outer_bits)

        def sync(stage: int) -> Sequence[Action]:
            return (Action(stage, Op.ALLREDUCE, None, deltas), Action(stage, Op.OUTER_STEP))

        steps = self.settings.inner_steps
        tails: list[Tail] = [*([_nothing] * (steps - 1)), sync]
        return cycled(inner, tails, OuterOptimizer(self.settings.outer_lr,
                                                   self.settings.outer_momentum))


class StreamingDiLoCoPolicy(TrainingPolicy):
    name = "streaming-diloco"
    summary = ("Streaming DiLoCo: fragments synced in turn, overlapped with inner steps, "
               "optionally 4-bit (arXiv 2501.18512)")
    settings_type: ClassVar[type[Any]] = StreamingSettings
    settings: StreamingSettings

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        inner = inner_plan(self.name, topology, job, self.settings.connections)
        steps, overlap = self.settings.inner_steps, self.settings.overlap
        fragments = self.settings.fragments or max(1, job.model.layers // 3)
        fragments = min(fragments, job.model.layers)
        spacing = steps // fragments
        if spacing < overlap + 1:
            raise InputError(
                f"overlap {overlap} needs at least {overlap + 1} inner steps between "
                f"fragments' syncs; inner_steps {steps} over {fragments} fragments leaves "
                f"{spacing}: raise inner_steps or lower fragments or overlap",
                "--option", "overlap")
        tails: list[list[tuple[Op, Collective]]] = [[] for _ in range(steps)]
        for k in range(fragments):
            done = (k + 1) * steps // fragments - 1  # the sync lands after this step
            deltas = Collective(Reduces.DELTAS, k, fragments, self.settings.outer_bits)
            outer = Collective(Reduces.DELTAS, k, fragments)
            if overlap == 0:
                tails[done] += [(Op.ALLREDUCE, deltas), (Op.OUTER_STEP, outer)]
            else:
                tails[done - overlap].append((Op.ALLREDUCE_START, deltas))
                tails[done] += [(Op.ALLREDUCE_WAIT, deltas), (Op.OUTER_STEP, outer)]
        mixing = self.settings.mixing if overlap else 0.0
        return cycled(inner, [_tail(t) for t in tails],
                      OuterOptimizer(self.settings.outer_lr,
                                     self.settings.outer_momentum, mixing=mixing))


def _tail(actions: list[tuple[Op, Collective]]) -> Tail:
    def tail(stage: int) -> Sequence[Action]:
        return tuple(Action(stage, op, None, c) for op, c in actions)

    return tail
