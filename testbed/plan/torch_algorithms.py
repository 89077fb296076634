"""torch 2.13's pipeline schedules' per-rank compute orders, computed without importing
torch (seconds of a planner's first run): the algorithms of the `pipeline_order` that
torch.distributed.pipelining.schedules' classes build in their constructors
(ScheduleLoopedBFS, ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble,
ScheduleZBVZeroBubble, ScheduleDualPipeV; torch is BSD-licensed), step for step, with the
stage-to-rank mappings of torch.distributed.pipelining._utils. Torch stays the reference:
tests/test_torch_algorithms.py compares every rank's order, and every refusal, with
torch's classes over a grid of shapes. Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

Step = tuple[int, str, int] | tuple[tuple[tuple[int, str, int], ...], str] | None
"""(stage, op, microbatch); an overlapped unit as ((parts...), "OVERLAP_F_B"); None where
torch pads a rank's list with an idle step."""


def stage_to_rank(ranks: int, stages: int, style: str) -> dict[int, int]:
    """torch's generate_stage_to_rank_mapping: looped (s % ranks) or V-shaped."""
    if style == "loop":
        return {s: s % ranks for s in range(stages)}
    if stages % ranks:
        raise ValueError(f"num_stages {stages} must be evenly divisible by pp_size {ranks} "
                         "for V schedules")
    mapping, rank = {}, 0
    for stage in range(stages):
        mapping[stage] = rank
        if (stage + 1) % ranks == 0:
            continue
        rank += 1 if (stage // ranks) % 2 == 0 else -1
    return mapping


def pipeline_order(schedule: str, ranks: int, virtual: int, microbatches: int
                   ) -> dict[int, list[Step]]:
    """Every rank's steps, as the class for `schedule` computes them; ValueError with
    torch's words where its constructor refuses."""
    if schedule == "looped-bfs":
        return {r: _looped_bfs(r, ranks, virtual, microbatches) for r in range(ranks)}
    if schedule in ("interleaved-1f1b", "interleaved-zb"):
        rounds = max(1, microbatches // ranks)
        if microbatches % rounds:
            name = "Interleaved 1F1B" if schedule == "interleaved-1f1b" else "Zero bubble"
            raise ValueError(f"{name} requires the number of microbatches to be a multiple of "
                             f"the number of rounds ({rounds}), but got {microbatches}.")
        zero = schedule == "interleaved-zb"
        order = {r: _interleaved(r, ranks, virtual, microbatches, microbatches // rounds, zero)
                 for r in range(ranks)}
        return _add_bubbles(order, ranks, ranks * virtual) if zero else order
    if schedule in ("zb-v", "dualpipe-v"):
        if virtual != 2:
            raise ValueError(f"ZBV requires exactly 2 stages per rank, but got {virtual}.")
        if schedule == "zb-v":
            return {r: _zbv(r, ranks, microbatches) for r in range(ranks)}
        if microbatches < 2 * ranks:
            raise ValueError("DualPipeV requires at least as many microbatches as stages, but "
                             f"got {microbatches} microbatches and {2 * ranks} stages.")
        return {r: _dualpipe_v(r, ranks, microbatches) for r in range(ranks)}
    raise ValueError(f"no algorithm for {schedule!r}")


def _looped_bfs(rank: int, ranks: int, virtual: int, n: int) -> list[Step]:
    stages = range(rank, ranks * virtual, ranks)
    ops: list[Step] = [None] * rank
    for stage in stages:
        ops += [(stage, "F", mb) for mb in range(n)]
    ops += [None] * (2 * (ranks - 1 - rank))
    for stage in reversed(stages):
        ops += [(stage, "B", mb) for mb in reversed(range(n))]
    return ops


def _interleaved(rank: int, ranks: int, local: int, n: int, per_round: int,
                 zero_bubble: bool) -> list[Step]:
    """ScheduleInterleaved1F1B's and ScheduleInterleavedZeroBubble's
    _calculate_single_rank_operations (the warm-up of _get_warmup_ops)."""
    warmup = min((local - 1) * per_round + (2 if not zero_bubble else 1) * (ranks - 1 - rank),
                 n * local)
    fwd_bwd = n * local - warmup
    cooldown = n * local - fwd_bwd

    def forward_stage(step: int) -> int:
        return ((step // per_round) % local) * ranks + rank

    def backward_stage(step: int) -> int:
        return (local - 1 - ((step - warmup) // per_round) % local) * ranks + rank

    return _one_f_one_b(local, ranks, warmup, fwd_bwd, cooldown, rank, forward_stage,
                        backward_stage, rank if zero_bubble else 0, zero_bubble)


def _one_f_one_b(local: int, ranks: int, warmup: int, fwd_bwd: int, cooldown: int, rank: int,
                 forward_stage: Callable[[int], int], backward_stage: Callable[[int], int],
                 one_f_one_b_microbatches: int, zero_bubble: bool) -> list[Step]:
    """torch's _get_1f1b_rank_ops."""
    fwd_mb: dict[int, int] = defaultdict(int)
    bwd_mb: dict[int, int] = defaultdict(int)
    weight_mb: dict[int, int] = defaultdict(int)
    ops: list[Step] = [None] * rank
    post_warmup = (ranks - rank - 1 if zero_bubble
                   else local * ranks + 2 * (ranks - 1 - rank) - (warmup + rank))
    backward = "I" if zero_bubble else "B"
    backward_ids: list[int] = []
    weights = 0

    def next_mb(counts: dict[int, int], stage: int) -> int:
        mb = counts[stage]
        counts[stage] = mb + 1
        return mb

    def weight_step(op: int) -> None:
        nonlocal weights
        if zero_bubble and op - warmup >= one_f_one_b_microbatches:
            stage = backward_stage(backward_ids[weights])
            ops.append((stage, "W", next_mb(weight_mb, stage)))
            weights += 1

    for op in range(warmup + fwd_bwd + cooldown):
        if op < warmup:
            stage = forward_stage(op)
            ops.append((stage, "F", next_mb(fwd_mb, stage)))
            if op == warmup - 1:
                ops += [None] * post_warmup
        elif op < warmup + fwd_bwd:
            stage = forward_stage(op)
            ops.append((stage, "F", next_mb(fwd_mb, stage)))
            stage = backward_stage(op)
            ops.append((stage, backward, next_mb(bwd_mb, stage)))
            backward_ids.append(op)
            weight_step(op)
        else:
            if not zero_bubble:
                ops.append(None)
            stage = backward_stage(op)
            ops.append((stage, backward, next_mb(bwd_mb, stage)))
            backward_ids.append(op)
            weight_step(op)
    while zero_bubble and weights < len(backward_ids):
        stage = backward_stage(backward_ids[weights])
        ops.append((stage, "W", next_mb(weight_mb, stage)))
        weights += 1
    return ops


def _add_bubbles(order: dict[int, list[Step]], ranks: int, stages: int
                 ) -> dict[int, list[Step]]:
    """ScheduleInterleavedZeroBubble._add_bubbles_to_actions: a rank idles a step where
    the action it is due waits for one another rank has not yet run."""
    seen: set[tuple[int, str, int]] = set()
    result: dict[int, list[Step]] = {rank: [] for rank in range(ranks)}
    pointer = dict.fromkeys(range(ranks), 0)

    def needs_bubble(stage: int, op: str, mb: int) -> bool:
        if op == "F":
            return stage != 0 and (stage - 1, op, mb) not in seen
        if op == "B":
            if stage == stages - 1:
                return (stage, "F", mb) not in seen
            return (stage + 1, op, mb) not in seen
        return False

    while True:
        stop = True
        now_seen: set[tuple[int, str, int]] = set()
        for rank in range(ranks):
            at = pointer[rank]
            if at >= len(order[rank]):
                continue
            stop = False
            action = order[rank][at]
            if action is None:
                pointer[rank] += 1
                result[rank].append(None)
                continue
            stage, op, mb = action  # type: ignore[misc]
            if needs_bubble(stage, op, mb):
                result[rank].append(None)
            else:
                result[rank].append(action)
                now_seen.add((stage, op, mb))
                pointer[rank] += 1
        seen |= now_seen
        if stop:
            return result


def _zbv(rank: int, ranks: int, n: int) -> list[Step]:
    """ScheduleZBVZeroBubble._calculate_single_rank_operations."""
    n_micro = max(2 * ranks - 1, n)
    ops: list[Step] = [None] * rank
    f0 = f1 = b0 = b1 = 0
    chunk0, chunk1 = rank, 2 * ranks - 1 - rank
    for _ in range(2 * (ranks - rank) - 1):
        ops.append((chunk0, "F", f0))
        f0 += 1
    for _ in range(rank):
        ops.append((chunk1, "F", f1))
        f1 += 1
        ops.append((chunk0, "F", f0))
        f0 += 1
    for _ in range(ranks - rank):
        ops.append((chunk1, "F", f1))
        f1 += 1
        ops += [(chunk1, "I", b1), (chunk1, "W", b1)]
        b1 += 1
    while f1 < f0 or f0 < n_micro:
        if f0 < n_micro:
            ops.append((chunk0, "F", f0))
            f0 += 1
        ops += [(chunk0, "I", b0), (chunk0, "W", b0)]
        b0 += 1
        ops.append((chunk1, "F", f1))
        f1 += 1
        ops += [(chunk1, "I", b1), (chunk1, "W", b1)]
        b1 += 1
    w0, w1 = b0, b1
    for _ in range(rank):
        ops.append((chunk0, "I", b0))
        b0 += 1
        ops.append((chunk1, "I", b1))
        b1 += 1
    for _ in range(ranks - rank):
        ops.append((chunk0, "I", b0))
        b0 += 1
        ops.append((chunk0, "W", w0))
        w0 += 1
    while w1 < b1:
        ops.append((chunk1, "W", w1))
        w1 += 1
    while w0 < b0:
        ops.append((chunk0, "W", w0))
        w0 += 1
    return [a if a is not None and a[2] < n else None for a in ops]  # type: ignore[misc]


# one branch per case of torch's own function, kept in its order to be read beside it
def _dualpipe_v(rank: int, ranks: int, chunks: int) -> list[Step]:  # noqa: C901
    """ScheduleDualPipeV._calculate_single_rank_operations."""
    ops: list[Step] = []
    counters: dict[tuple[int, str], int] = {}
    weights: list[tuple[int, int]] = []
    stage0, stage1 = rank, 2 * ranks - 1 - rank

    def count_backward(stage: int) -> None:
        counters[(stage, "I")] = counters.get((stage, "I"), 0) + 1
        counters[(stage, "W")] = counters.get((stage, "W"), 0) + 1

    def overlap(forward: int, backward: int) -> None:
        f_mb, b_mb = counters.get((forward, "F"), 0), counters.get((backward, "I"), 0)
        ops.append((((forward, "F", f_mb), (backward, "B", b_mb)), "OVERLAP_F_B"))
        counters[(forward, "F")] = f_mb + 1
        count_backward(backward)

    def add(stage: int, op: str) -> None:
        key = (stage, op if op != "B" else "I")
        mb = counters.get(key, 0)
        ops.append((stage, op, mb))
        if op == "B":
            count_backward(stage)
            return
        if op == "I":
            weights.append((stage, mb))
        counters[key] = mb + 1

    def weight_if_pending() -> None:
        if weights:
            stage, mb = weights.pop(0)
            ops.append((stage, "W", mb))
            counters[(stage, "W")] = counters.get((stage, "W"), 0) + 1

    for _ in range((ranks - rank - 1) * 2):
        add(stage0, "F")
    for _ in range(rank + 1):
        add(stage0, "F")
        add(stage1, "F")
    for _ in range(ranks - rank - 1):
        add(stage1, "I")
        weight_if_pending()
        add(stage1, "F")
    for i in range(chunks - ranks * 2 + rank + 1):
        if i == 0 and rank == ranks - 1:
            add(stage0, "F")
            add(stage1, "B")
        else:
            overlap(stage0, stage1)
        overlap(stage1, stage0)
    for _ in range(ranks - rank - 1):
        add(stage1, "B")
        overlap(stage1, stage0)
    step_6 = rank + 1
    zero_bubble = False
    for i in range(step_6):
        if i == step_6 // 2 and rank % 2 == 1:
            zero_bubble = True
        add(stage1, "I" if zero_bubble else "B")
        if i == step_6 // 2 and rank % 2 == 0:
            zero_bubble = True
        add(stage0, "I" if zero_bubble else "B")
    for _ in range(ranks - rank - 1):
        weight_if_pending()
        add(stage0, "I" if zero_bubble else "B")
    for _ in range(rank + 1):
        weight_if_pending()
    return ops


def step_text(step: Step) -> str | None:
    """A step in torch's text form (`2F0`, `(0F7;7B3)OVERLAP_F_B`), None for an idle one."""
    if step is None:
        return None
    if isinstance(step[0], tuple):
        parts = step[0]
        return "(" + ";".join(f"{s}{o}{m}" for s, o, m in parts) + f"){step[1]}"
    stage, op, mb = step
    return f"{stage}{op}{mb}"
