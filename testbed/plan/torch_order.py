"""Per-rank compute orders of torch's own pipeline schedules: the `pipeline_order` that
torch 2.13's classes (torch.distributed.pipelining.schedules) compute in their
constructors, by their own algorithms ported step for step (testbed.plan.torch_algorithms)
so that planning needs no import of torch (seconds of a first run); tests compare them
with torch's classes on every shape of a grid. torch's own CSV form of a schedule
(`_dump_csv`: one row per rank, its actions) reads into the same shape.
"""

from __future__ import annotations

import csv
import functools
import io
import re
import threading
from dataclasses import dataclass

from testbed.errors import InputError
from testbed.job.model import Job
from testbed.plan.model import Action
from testbed.plan.torch_algorithms import pipeline_order, stage_to_rank, step_text

TORCH_CLASSES = {
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "looped-bfs": "ScheduleLoopedBFS",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zb-v": "ScheduleZBVZeroBubble",
    "dualpipe-v": "ScheduleDualPipeV",
}
"""Our name of each schedule, and its class in torch."""
V_SHAPED = frozenset({"zb-v", "dualpipe-v"})
"""Two stages per rank, g and 2P - 1 - g; the others loop (g, g + P, ...)."""


@dataclass(frozen=True)
class TorchOrder:
    """What a schedule runs: compute actions per rank, in order, and each stage's rank."""

    compute: dict[int, tuple[Action, ...]]
    stage_rank: dict[int, int]

    @property
    def ranks(self) -> int:
        return len(self.compute)

    @property
    def stages(self) -> int:
        return len(self.stage_rank)

    def stages_of(self, rank: int) -> tuple[int, ...]:
        return tuple(sorted(s for s, r in self.stage_rank.items() if r == rank))


_LOADING = threading.Lock()
"""Held while torch is imported (load_torch)."""


def load_torch() -> None:
    """Import torch's pipelining schedules now (seconds, once per process), for a plugin
    that uses torch's classes itself (the orders here need no torch). Every import of
    torch here comes through one lock: Python's import locks see a deadlock where two
    threads import a package and its module at once (and one of them fails)."""
    with _LOADING:
        import torch.distributed.pipelining.schedules  # noqa: F401


def stage_ranks(schedule: str, ranks: int, virtual: int) -> dict[int, int]:
    """Each stage's rank under `schedule`: torch's own mapping (looped or V-shaped)."""
    style = "v" if schedule in V_SHAPED else "loop"
    return stage_to_rank(ranks, ranks * virtual, style)


@functools.lru_cache(maxsize=64)
def torch_order(schedule: str, ranks: int, virtual: int, microbatches: int) -> TorchOrder:
    """The compute order torch's class for `schedule` gives `ranks` ranks with `virtual`
    stages each. ValueError with torch's reason where torch refuses."""
    if schedule not in TORCH_CLASSES:
        raise ValueError(f"torch has no class for {schedule!r}")
    steps = pipeline_order(schedule, ranks, virtual, microbatches)
    compute = {rank: tuple(Action.parse(text) for text in map(step_text, steps[rank])
                           if text is not None) for rank in sorted(steps)}
    stage_rank = {leaf.stage: rank for rank, actions in compute.items()
                  for action in actions for leaf in action.leaves}
    return TorchOrder(compute, dict(sorted(stage_rank.items())))


def checked_torch_order(job: Job, schedule: str, ranks: int, virtual: int,
                        microbatches: int) -> TorchOrder:
    """torch_order, with torch's constraints on the job's microbatches refused as bad
    input naming the key."""
    key = "job.microbatches" if job.microbatches is not None else "job.global_batch"
    if schedule not in TORCH_CLASSES:
        raise ValueError(f"torch has no class for {schedule!r}: give its order")
    name = TORCH_CLASSES[schedule]
    rounds = max(1, microbatches // ranks)
    if schedule in ("interleaved-1f1b", "interleaved-zb") and microbatches % rounds:
        raise InputError(f"{schedule} over {ranks} GPUs runs microbatches in rounds of about "
                         f"{ranks}: {microbatches} is not a multiple of its {rounds} rounds "
                         f"(torch's {name})", job.source, key)
    if schedule == "dualpipe-v" and microbatches < ranks * virtual:
        raise InputError(f"dualpipe-v needs at least as many microbatches as stages "
                         f"({ranks * virtual}), got {microbatches} (torch's {name})",
                         job.source, key)
    try:
        return torch_order(schedule, ranks, virtual, microbatches)
    except ValueError as exc:
        raise InputError(f"torch's {name} refuses {ranks} GPUs x {virtual} stages and "
                         f"{microbatches} microbatches: {exc}", job.source, key) from None


_NOT_COMPUTE = re.compile(r"^\d+(UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)\d*$")
"""torch's actions that its lowering derives from the compute order (FSDP, gradient
reduction, communication): a CSV in its compute_comms form carries them too."""


def parse_torch_csv(text: str, source: str | None = None) -> TorchOrder:
    """torch's CSV form of a schedule: row r is rank r's actions in order (`_dump_csv`;
    empty cells are torch's idle steps). Only compute actions are kept: communication
    is lowered from them again, as torch lowers a compute-only schedule."""
    compute: dict[int, tuple[Action, ...]] = {}
    stage_rank: dict[int, int] = {}
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise InputError(f"not CSV: {exc}", source) from None
    for rank, row in enumerate(rows):
        actions = []
        for column, cell in enumerate(row, start=1):
            text_cell = cell.strip()
            if not text_cell or _NOT_COMPUTE.match(text_cell):
                continue
            try:
                action = Action.parse(text_cell)
            except ValueError as exc:
                raise InputError(f"bad action: {exc}", source,
                                 f"line {rank + 1} column {column}") from None
            if not action.op.is_compute:
                raise InputError(f"{action} is not one of torch's schedule actions (F, B, I, "
                                 "W, OVERLAP_F_B)", source, f"line {rank + 1} column {column}")
            for leaf in action.leaves:
                other = stage_rank.setdefault(leaf.stage, rank)
                if other != rank:
                    raise InputError(f"stage {leaf.stage} is on rank {other} (line {other + 1}) "
                                     f"and on rank {rank}", source, f"line {rank + 1}")
            actions.append(action)
        compute[rank] = tuple(actions)
    if not stage_rank:
        raise InputError("no compute actions: expected one row of actions per rank, as "
                         "torch's _dump_csv writes them (like 0F0,0F1,,0B0)", source)
    missing = next(s for s in range(len(stage_rank) + 1) if s not in stage_rank)
    if missing < len(stage_rank):
        raise InputError(f"no rank runs stage {missing}", source)
    return TorchOrder(compute, stage_rank)


def is_torch_csv(text: str) -> bool:
    """Whether a CSV reads as torch's form (its first non-empty cell is an action) rather
    than a plan's (its rows begin with what they are: meta, place, actions...)."""
    for row in csv.reader(io.StringIO(text)):
        for cell in row:
            if cell.strip():
                first = cell.strip()
                return bool(_NOT_COMPUTE.match(first)) or _reads_as_action(first)
    return False


def _reads_as_action(text: str) -> bool:
    try:
        Action.parse(text)
    except ValueError:
        return False
    return True
