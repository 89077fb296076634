"""Per-stage action lists of the published pipeline schedules, with their communication."""

from __future__ import annotations

import functools
import itertools
from enum import StrEnum

from testbed.plan.collective import EVERY_STEP, Collective
from testbed.plan.model import Action, Op


class Sends(StrEnum):
    """When a stage waits for its own sends to complete."""

    TORCH = "torch"
    """As torch.distributed.pipelining's ScheduleGPipe and Schedule1F1B run: GPipe waits
    for all forward sends before the first backward and for all backward sends at the
    end; 1F1B posts each send together with the next receive and waits for both before
    it computes again (a warm-up forward first waits for the previous one's send). torch's
    schedules of several stages per GPU wait as its runtime for lowered schedules does:
    for every send at the end of the step (testbed.plan.lowering)."""
    EAGER = "eager"
    """Never waits: the next compute starts as soon as its input is there, and sends
    complete in the background (as torch's runtime for lowered schedules, which waits
    for its sends only at the end of the step)."""


def gpipe_compute(stage: int, stages: int, microbatches: int) -> list[Action]:
    """GPipe: every forward, then every backward, both in microbatch order (as torch does)."""
    del stages
    forwards = [Action(stage, Op.F, mb) for mb in range(microbatches)]
    backwards = [Action(stage, Op.B, mb) for mb in range(microbatches)]
    return forwards + backwards


def one_f_one_b_compute(stage: int, stages: int, microbatches: int,
                        extra_warmup: int = 0) -> list[Action]:
    """1F1B: warm-up forwards, then alternate one forward and one backward, then drain.
    `extra_warmup` more forwards before the first backward keep more microbatches in
    flight, to cover long round trips across a WAN (at the cost of activation memory)."""
    warmup = min(stages - 1 - stage + extra_warmup, microbatches)
    out = [Action(stage, Op.F, mb) for mb in range(warmup)]
    forward, backward = warmup, 0
    while forward < microbatches:
        out.append(Action(stage, Op.F, forward))
        out.append(Action(stage, Op.B, backward))
        forward += 1
        backward += 1
    out.extend(Action(stage, Op.B, mb) for mb in range(backward, microbatches))
    return out


def with_communication(compute: list[Action], stages: int) -> list[Action]:
    """Receive right before each compute that needs input, send right after it."""
    out: list[Action] = []
    for action in compute:
        stage, mb = action.stage, action.microbatch
        if action.op is Op.F:
            if stage > 0:
                out.append(Action(stage, Op.RECV_F, mb))
            out.append(action)
            if stage < stages - 1:
                out.append(Action(stage, Op.SEND_F, mb))
        elif action.op is Op.B:
            if stage < stages - 1:
                out.append(Action(stage, Op.RECV_B, mb))
            out.append(action)
            if stage > 0:
                out.append(Action(stage, Op.SEND_B, mb))
        else:
            out.append(action)
    return out


class _Posts:
    """Builds one stage's actions with torch's communication: a neighbour that does not
    exist gets no message."""

    def __init__(self, stage: int, stages: int) -> None:
        self.stage = stage
        self.has_prev, self.has_next = stage > 0, stage < stages - 1
        self.out: list[Action] = []

    def add(self, op: Op, mb: int) -> None:
        needs_next = op in (Op.SEND_F, Op.WAIT_F, Op.RECV_B)
        needs_prev = op in (Op.SEND_B, Op.WAIT_B, Op.RECV_F)
        if (needs_next and not self.has_next) or (needs_prev and not self.has_prev):
            return
        self.out.append(Action(self.stage, op, mb))

    def fused(self, send: Op, sent: int, recv: Op, received: int) -> None:
        """A send posted with a receive, both waited for (torch's batched p2p)."""
        self.add(send, sent)
        self.add(recv, received)
        self.add(Op.WAIT_F if send is Op.SEND_F else Op.WAIT_B, sent)


def torch_gpipe(stage: int, stages: int, microbatches: int) -> list[Action]:
    """ScheduleGPipe._step_microbatches: sends are waited only between the phases and at
    the end."""
    post = _Posts(stage, stages)
    for recv, compute, send, wait in ((Op.RECV_F, Op.F, Op.SEND_F, Op.WAIT_F),
                                      (Op.RECV_B, Op.B, Op.SEND_B, Op.WAIT_B)):
        for mb in range(microbatches):
            post.add(recv, mb)
            post.add(compute, mb)
            post.add(send, mb)
        for mb in range(microbatches):
            post.add(wait, mb)
    return post.out


def torch_1f1b(stage: int, stages: int, microbatches: int, extra_warmup: int = 0) -> list[Action]:
    """Schedule1F1B._step_microbatches (with `extra_warmup` more warm-up forwards): the
    last warm-up forward's send and every later send go out with the next receive, and
    the stage waits for both before computing again."""
    post = _Posts(stage, stages)
    warmup = min(microbatches, stages - stage + extra_warmup)
    forward = backward = 0
    posted: int | None = None
    for _ in range(warmup):
        post.add(Op.RECV_F, forward)
        post.add(Op.F, forward)
        if posted is not None:
            post.add(Op.WAIT_F, posted)
            posted = None
        if forward != warmup - 1:
            post.add(Op.SEND_F, forward)
            posted = forward
        forward += 1
    held_forward = forward - 1
    while True:
        post.fused(Op.SEND_F, held_forward, Op.RECV_B, backward)
        post.add(Op.B, backward)
        held_backward = backward
        backward += 1
        if forward == microbatches:
            break
        post.fused(Op.SEND_B, held_backward, Op.RECV_F, forward)
        post.add(Op.F, forward)
        held_forward = forward
        forward += 1
    post.add(Op.SEND_B, held_backward)
    while backward < microbatches:
        post.add(Op.RECV_B, backward)
        post.add(Op.B, backward)
        post.add(Op.WAIT_B, held_backward)
        post.add(Op.SEND_B, backward)
        held_backward = backward
        backward += 1
    post.add(Op.WAIT_B, held_backward)
    return post.out


def with_update(actions: list[Action], stage: int, replicas: int,
                gradients: Collective | None = EVERY_STEP, buckets: int = 1) -> list[Action]:
    """Gradient all-reduce across the replicas of a stage (if any, and as `gradients` says;
    None: none), then the optimizer step. In `buckets` buckets (testbed.plan.buckets):
    each starts right after the stage's last backward, as that backward has its values,
    and is waited for before the step; one bucket is one all-reduce after everything."""
    if replicas < 2 or gradients is None:
        return [*actions, Action(stage, Op.STEP)]
    if buckets <= 1:
        return [*actions, Action(stage, Op.ALLREDUCE, None, gradients), Action(stage, Op.STEP)]
    last = max(i for i, a in enumerate(actions) if a.op in (Op.B, Op.W))
    starts, waits = reduce_actions(stage, gradients, buckets)
    return [*actions[: last + 1], *starts, *actions[last + 1 :], *waits, Action(stage, Op.STEP)]


def reduce_actions(stage: int, collective: Collective, buckets: int
                   ) -> tuple[list[Action], list[Action]]:
    """A stage's reduction of `collective` in `buckets` buckets: what follows its last
    backward (each bucket's START, which starts as the backward has its values; one
    ALLREDUCE when there is one bucket) and what precedes its step (each bucket's WAIT)."""
    if buckets <= 1:
        return [Action(stage, Op.ALLREDUCE, None, collective)], []
    parts = [collective.in_bucket(k, buckets) for k in range(buckets)]
    return ([Action(stage, Op.ALLREDUCE_START, None, c) for c in parts],
            [Action(stage, Op.ALLREDUCE_WAIT, None, c) for c in parts])


def parse_schedule(schedule: str) -> tuple[str, tuple[int, ...]]:
    """`gpipe`, `1f1b`, `1f1b+K` (K extra warm-up forwards on every stage) or
    `1f1b+K0/K1/...` (one count per stage, never growing down the pipeline: a stage
    before more WAN crossings keeps more microbatches in flight)."""
    name, _, extra = schedule.partition("+")
    counts = extra.split("/") if extra else []
    if name not in ("gpipe", "1f1b") or (extra and name != "1f1b") \
            or not all(c.isdigit() for c in counts):
        raise ValueError(f"unknown schedule {schedule!r} (gpipe, 1f1b, 1f1b+K or "
                         "1f1b+K0/K1/... per stage)")
    extras = tuple(int(c) for c in counts)
    if any(later > earlier for earlier, later in itertools.pairwise(extras)):
        raise ValueError(f"schedule {schedule!r}: per-stage warm-up must not grow down the "
                         "pipeline (a later stage would wait on one that waits on it)")
    return name, extras


def extra_warmup_of(schedule: str, stage: int, stages: int) -> int:
    """Extra warm-up forwards of `stage` under `schedule` (0 for gpipe and plain 1f1b)."""
    _, extras = parse_schedule(schedule)
    if len(extras) > 1 and len(extras) != stages:
        raise ValueError(f"schedule {schedule!r} gives {len(extras)} per-stage warm-up "
                         f"counts for {stages} stages")
    if not extras:
        return 0
    return extras[stage] if len(extras) > 1 else extras[0]


ORDERS_KEPT = 4096
"""Stage orders kept once made: a plan search builds and checks the same ones for every
placement, replica count and DC subset (Action is immutable, so they are shared)."""


def schedule_compute(schedule: str, stage: int, stages: int, microbatches: int) -> list[Action]:
    return list(_schedule_compute(schedule, stage, stages, microbatches))


@functools.lru_cache(maxsize=ORDERS_KEPT)
def _schedule_compute(schedule: str, stage: int, stages: int, microbatches: int
                      ) -> tuple[Action, ...]:
    name, _ = parse_schedule(schedule)
    if name == "gpipe":
        return tuple(gpipe_compute(stage, stages, microbatches))
    return tuple(one_f_one_b_compute(stage, stages, microbatches,
                                     extra_warmup_of(schedule, stage, stages)))


def stage_actions(
    schedule: str, stage: int, stages: int, microbatches: int, replicas: int,
    sends: Sends = Sends.EAGER, gradients: Collective | None = EVERY_STEP, buckets: int = 1,
) -> list[Action]:
    return list(_stage_actions(schedule, stage, stages, microbatches, replicas, sends,
                               gradients, buckets))


@functools.lru_cache(maxsize=ORDERS_KEPT)
def _stage_actions(schedule: str, stage: int, stages: int, microbatches: int, replicas: int,
                   sends: Sends, gradients: Collective | None, buckets: int = 1
                   ) -> tuple[Action, ...]:
    if sends is Sends.EAGER:
        actions = with_communication(schedule_compute(schedule, stage, stages, microbatches),
                                     stages)
    elif parse_schedule(schedule)[0] == "gpipe":
        actions = torch_gpipe(stage, stages, microbatches)
    else:
        actions = torch_1f1b(stage, stages, microbatches,
                             extra_warmup_of(schedule, stage, stages))
    return tuple(with_update(actions, stage, replicas, gradients, buckets))


def schedule_actions(schedule: str, stages: int, microbatches: int, replicas: int,
                     sends: Sends = Sends.EAGER, gradients: Collective | None = EVERY_STEP
                     ) -> tuple[tuple[Action, ...], ...]:
    """Each stage's compute order and action list under this schedule (one stage per
    GPU), as build_plan gives its GPUs: two schedules with the same make the same plan
    on the same placement, so a planner need simulate only one (more warm-up than there
    are microbatches to keep in flight is the same 1F1B; with every microbatch in
    warm-up it may be GPipe)."""
    return tuple((*schedule_compute(schedule, stage, stages, microbatches),
                  *stage_actions(schedule, stage, stages, microbatches, replicas, sends,
                                 gradients))
                 for stage in range(stages))
