"""The Plan: where each (replica, stage) runs, what each GPU does in order, how links are used.

Actions follow torch.distributed.pipelining's text form: `2F0` is stage 2, forward,
microbatch 0; `1SEND_B3` sends microbatch 3's input gradient from stage 1 to stage 0, and
`1WAIT_B3` waits until that send has completed (a stage that never waits on its sends
leaves them out).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


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
    STEP = "STEP"
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
    def needs_microbatch(self) -> bool:
        return self not in (Op.ALLREDUCE, Op.STEP, Op.PREFILL)


# Longest names first so that `SEND_F` is not read as `S` + ...
_ACTION = re.compile(
    r"^(\d+)(" + "|".join(sorted((op.value for op in Op), key=len, reverse=True)) + r")(\d*)$"
)


@dataclass(frozen=True, order=True)
class Action:
    stage: int
    op: Op
    microbatch: int | None = None

    def __str__(self) -> str:
        mb = "" if self.microbatch is None else str(self.microbatch)
        return f"{self.stage}{self.op.value}{mb}"

    @classmethod
    def parse(cls, text: str) -> Action:
        match = _ACTION.match(text.strip())
        if not match:
            raise ValueError(f"not an action: {text!r} (expected like 0F1, 2SEND_B0, 1ALLREDUCE)")
        stage, op_text, mb_text = match.groups()
        op = Op(op_text)
        microbatch = int(mb_text) if mb_text else None
        if op.needs_microbatch and microbatch is None:
            raise ValueError(f"{text!r}: {op.value} needs a microbatch number")
        if not op.needs_microbatch and microbatch is not None:
            raise ValueError(f"{text!r}: {op.value} takes no microbatch number")
        return cls(int(stage), op, microbatch)


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


Worker = tuple[int, int]
"""(replica, stage)."""


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
        }


def pair_key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def split_layers(layers: int, stages: int) -> tuple[int, ...]:
    """As even as possible; the first stages take the remainder."""
    base, extra = divmod(layers, stages)
    return tuple(base + (1 if s < extra else 0) for s in range(stages))
