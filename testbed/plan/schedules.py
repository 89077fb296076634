"""Per-stage action lists of the published pipeline schedules, with their communication."""

from __future__ import annotations

from testbed.plan.model import Action, Op


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


def with_update(actions: list[Action], stage: int, replicas: int) -> list[Action]:
    """Gradient all-reduce across the replicas of a stage (if any), then the optimizer step."""
    tail = [Action(stage, Op.ALLREDUCE)] if replicas > 1 else []
    return [*actions, *tail, Action(stage, Op.STEP)]


def parse_schedule(schedule: str) -> tuple[str, int]:
    """`gpipe`, `1f1b`, or `1f1b+K` (1F1B with K extra warm-up forwards)."""
    name, _, extra = schedule.partition("+")
    if name not in ("gpipe", "1f1b") or (extra and (name != "1f1b" or not extra.isdigit())):
        raise ValueError(f"unknown schedule {schedule!r} (gpipe, 1f1b or 1f1b+K)")
    return name, int(extra or 0)


def schedule_compute(schedule: str, stage: int, stages: int, microbatches: int) -> list[Action]:
    name, extra = parse_schedule(schedule)
    if name == "gpipe":
        return gpipe_compute(stage, stages, microbatches)
    return one_f_one_b_compute(stage, stages, microbatches, extra)


def stage_actions(
    schedule: str, stage: int, stages: int, microbatches: int, replicas: int
) -> list[Action]:
    compute = schedule_compute(schedule, stage, stages, microbatches)
    return with_update(with_communication(compute, stages), stage, replicas)
