"""Per-stage action lists of the published pipeline schedules, with their communication."""

from __future__ import annotations

from testbed.plan.model import Action, Op


def gpipe_compute(stage: int, stages: int, microbatches: int) -> list[Action]:
    """GPipe: every forward, then every backward, both in microbatch order (as torch does)."""
    del stages
    forwards = [Action(stage, Op.F, mb) for mb in range(microbatches)]
    backwards = [Action(stage, Op.B, mb) for mb in range(microbatches)]
    return forwards + backwards


def one_f_one_b_compute(stage: int, stages: int, microbatches: int) -> list[Action]:
    """1F1B: warm-up forwards, then alternate one forward and one backward, then drain."""
    warmup = min(stages - 1 - stage, microbatches)
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


SCHEDULES = {"gpipe": gpipe_compute, "1f1b": one_f_one_b_compute}


def stage_actions(
    schedule: str, stage: int, stages: int, microbatches: int, replicas: int
) -> list[Action]:
    compute = SCHEDULES[schedule](stage, stages, microbatches)
    return with_update(with_communication(compute, stages), stage, replicas)
