"""The Plan: where each (replica, stage) runs, what each GPU does in order, how links are used.

Actions follow torch.distributed.pipelining's text form: `2F0` is stage 2, forward,
microbatch 0; `1SEND_B3` sends microbatch 3's input gradient from stage 1 to stage 0, and
`1WAIT_B3` waits until that send has completed (a stage that never waits on its sends
leaves them out). An all-reduce may say what it reduces in brackets (testbed.plan.
collective): `0ALLREDUCE[delta,f1/4,int4]`.

A plan is one iteration's program, repeated, or a cycle of programs (`programs`, `cycle`):
DiLoCo steps locally for H iterations and syncs in the H-th.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from testbed.plan.collective import EVERY_STEP, Collective, Reduces, Scope


class Op(StrEnum):
    F = "F"
    B = "B"
    SEND_F = "SEND_F"
    RECV_F = "RECV_F"
    SEND_B = "SEND_B"
    RECV_B = "RECV_B"
    WAIT_F = "WAIT_F"
    WAIT_B = "WAIT_B"
    ALLREDUCE = "ALLREDUCE"
    """Reduce with the stage's replicas and wait for the result."""
    ALLREDUCE_START = "ALLREDUCE_START"
    """Start a reduction; the stage goes on while it runs (Streaming DiLoCo's overlap)."""
    ALLREDUCE_WAIT = "ALLREDUCE_WAIT"
    """Wait for the reduction this stage started with the same collective."""
    STEP = "STEP"
    """The (inner) optimizer step on this iteration's gradients."""
    OUTER_STEP = "OUTER_STEP"
    """The outer optimizer step on reduced parameter deltas (DiLoCo): the fragment's outer
    parameters move, and the local ones take them."""
    PREFILL = "PREFILL"

    @property
    def is_compute(self) -> bool:
        return self in (Op.F, Op.B)

    @property
    def is_send(self) -> bool:
        return self in (Op.SEND_F, Op.SEND_B)

    @property
    def is_recv(self) -> bool:
        return self in (Op.RECV_F, Op.RECV_B)

    @property
    def is_wait(self) -> bool:
        """Waits until this stage's own send of that microbatch has completed."""
        return self in (Op.WAIT_F, Op.WAIT_B)

    @property
    def is_collective(self) -> bool:
        """Takes a collective (between brackets in the text form)."""
        return self in _COLLECTIVE_OPS

    @property
    def needs_microbatch(self) -> bool:
        return self not in _WHOLE_ITERATION_OPS


_COLLECTIVE_OPS = frozenset({Op.ALLREDUCE, Op.ALLREDUCE_START, Op.ALLREDUCE_WAIT, Op.OUTER_STEP})
_WHOLE_ITERATION_OPS = frozenset({*_COLLECTIVE_OPS, Op.STEP, Op.PREFILL})

# Longest names first so that `SEND_F` is not read as `S` + ...
_ACTION = re.compile(
    r"^(\d+)(" + "|".join(sorted((op.value for op in Op), key=len, reverse=True))
    + r")(\d*)(?:\[([^\]]*)\])?$"
)
_WHOLE_DELTAS = Collective(Reduces.DELTAS)


@dataclass(frozen=True, order=True)
class Action:
    stage: int
    op: Op
    microbatch: int | None = None
    collective: Collective | None = None
    """For the all-reduce ops and OUTER_STEP: what, which fragment, which payload, among
    whom. None: the whole gradient (the whole deltas for OUTER_STEP), as every-step data
    parallelism all-reduces it."""

    def __post_init__(self) -> None:
        if self.collective is not None:
            if not self.op.is_collective:
                raise ValueError(f"{self.op.value} takes no collective")
            if self.op is Op.OUTER_STEP and (self.collective.reduces is not Reduces.DELTAS
                                             or self.collective.payload
                                             or self.collective.scope is not Scope.ALL):
                raise ValueError("an OUTER_STEP names only its fragment (fK/N)")
            if self.collective == self.implied:  # one spelling per action
                object.__setattr__(self, "collective", None)

    @property
    def implied(self) -> Collective | None:
        """The collective an action without brackets stands for."""
        return _implied(self.op)

    @property
    def subject(self) -> Collective:
        """This collective action's collective, spelt or implied."""
        subject = self.collective or self.implied
        if subject is None:
            raise ValueError(f"{self} is not a collective action")
        return subject

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else str(self.microbatch)
        implied = self.implied
        spec = "" if self.collective is None or implied is None else (
            f"[{self.collective.spelled(implied)}]")
        return f"{self.stage}{self.op.value}{mb}{spec}"

    @classmethod
    def parse(cls, text: str) -> Action:
        match = _ACTION.match(text.strip())
        if not match:
            raise ValueError(f"not an action: {text!r} (expected like 0F1, 2SEND_B0, "
                             "1ALLREDUCE, 0ALLREDUCE_START[delta,f1/4,int4])")
        stage, op_text, mb_text, spec = match.groups()
        op = Op(op_text)
        microbatch = int(mb_text) if mb_text else None
        if op.needs_microbatch and microbatch is None:
            raise ValueError(f"{text!r}: {op.value} needs a microbatch number")
        if not op.needs_microbatch and microbatch is not None:
            raise ValueError(f"{text!r}: {op.value} takes no microbatch number")
        if spec is not None and not op.is_collective:
            raise ValueError(f"{text!r}: {op.value} takes nothing in brackets")
        try:
            collective = Collective.parse(spec, _implied(op)) if spec is not None else None
            return cls(int(stage), op, microbatch, collective)
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc}") from None


def _implied(op: Op) -> Collective | None:
    if not op.is_collective:
        return None
    return _WHOLE_DELTAS if op is Op.OUTER_STEP else EVERY_STEP


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

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in (("slow_start_after_idle", self.slow_start_after_idle),
                                  ("buffer_bytes", self.buffer_bytes)) if v is not None}


class Sharing(StrEnum):
    """How concurrent transfers share one WAN link direction."""

    FAIR = "fair"
    """TCP fair share: every flow at once."""
    ARBITRATED = "arbitrated"
    """One transfer at a time, in the order the policy's `next_transfer` chooses."""


@dataclass(frozen=True)
class OuterOptimizer:
    """How OUTER_STEP moves the outer parameters (DiLoCo, arXiv 2311.08105: SGD with
    Nesterov momentum on the averaged deltas, learning rate 0.7, momentum 0.9)."""

    lr: float = 0.7
    momentum: float = 0.9
    nesterov: bool = True
    mixing: float = 0.0
    """Weight the local parameters keep when the outer ones arrive after inner steps went
    on (Streaming DiLoCo's overlap, arXiv 2501.18512: alpha, 0.5 there); 0 replaces them."""

    def to_dict(self) -> dict[str, Any]:
        return {"lr": self.lr, "momentum": self.momentum, "nesterov": self.nesterov,
                "mixing": self.mixing}


Worker = tuple[int, int]
"""(replica, stage)."""

Program = Mapping[str, tuple[Action, ...]]
"""One iteration's ordered actions per GPU."""


@dataclass(frozen=True)
class Plan:
    policy: str
    dp: int
    pp: int
    microbatches: int
    microbatch_size: int
    layers: tuple[int, ...]
    """Transformer layers per stage."""
    placement: Mapping[Worker, tuple[str, ...]]
    """GPUs of each (replica, stage); more than one when tensor parallel."""
    actions: Mapping[str, tuple[Action, ...]]
    """Ordered actions per GPU; every GPU of a tensor-parallel group has the same list."""
    connections: Mapping[tuple[str, str], int]
    """TCP connections per communicating GPU pair (names sorted)."""
    sharing: Mapping[tuple[str, str], Sharing]
    """Per directed (source DC, destination DC) pair that carries pipeline traffic."""
    tp: int = 1
    dp_cells: tuple[tuple[int, ...], ...] = ()
    """Groups of replicas that take turns on the same WAN links."""
    host_tcp: HostTcp = HostTcp()
    notes: Mapping[str, Any] = field(default_factory=dict)
    """Free-form facts a policy records: candidates considered, why one won."""
    programs: tuple[Program, ...] = ()
    """Iteration programs besides `actions` (which is program 0), for plans whose
    iterations differ."""
    cycle: tuple[int, ...] = ()
    """The program each iteration of a cycle runs (0 is `actions`, i is programs[i - 1]);
    iteration n runs cycle[n % len(cycle)]. Empty: every iteration runs `actions`."""
    outer: OuterOptimizer = OuterOptimizer()
    """What OUTER_STEP actions do, where the plan has any."""

    @property
    def has_outer_steps(self) -> bool:
        return any(a.op is Op.OUTER_STEP for program in self.all_programs()
                   for actions in program.values() for a in actions)

    @property
    def period(self) -> int:
        """Iterations in one cycle."""
        return len(self.cycle) or 1

    def all_programs(self) -> tuple[Program, ...]:
        return (self.actions, *self.programs)

    def program_of(self, iteration: int) -> int:
        """Which program iteration `iteration` runs."""
        return self.cycle[iteration % len(self.cycle)] if self.cycle else 0

    def actions_at(self, iteration: int) -> Program:
        return self.all_programs()[self.program_of(iteration)]

    def gpus_of(self, replica: int, stage: int) -> tuple[str, ...]:
        return self.placement[(replica, stage)]

    def worker_of(self, gpu: str) -> Worker:
        for worker, gpus in self.placement.items():
            if gpu in gpus:
                return worker
        raise KeyError(gpu)

    def workers(self) -> Iterator[tuple[Worker, tuple[str, ...]]]:
        yield from sorted(self.placement.items())

    def lead_gpu(self, replica: int, stage: int) -> str:
        return self.placement[(replica, stage)][0]

    def used_gpus(self) -> list[str]:
        return [gpu for _, gpus in self.workers() for gpu in gpus]

    def connections_between(self, a: str, b: str) -> int:
        return self.connections.get(pair_key(a, b), 1)

    def stage_dcs(self, dc_of: Any) -> list[set[str]]:
        """DCs that host each stage, given a function from GPU to DC."""
        out: list[set[str]] = [set() for _ in range(self.pp)]
        for (_, stage), gpus in self.placement.items():
            out[stage].update(dc_of(gpu) for gpu in gpus)
        return out

    def summary(self) -> dict[str, Any]:
        """The `plan` block of results.json."""
        return {
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
            **({"outer": self.outer.to_dict()} if self.has_outer_steps else {}),
        }


def pair_key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def split_layers(layers: int, stages: int) -> tuple[int, ...]:
    """As even as possible; the first stages take the remainder."""
    base, extra = divmod(layers, stages)
    return tuple(base + (1 if s < extra else 0) for s in range(stages))
