"""Check a plan's shape, then dry-run it (testbed.plan.dry_run), naming the first thing
that would hang or corrupt training."""

from __future__ import annotations

from collections import Counter

from testbed.plan.collective import Reduces
from testbed.plan.dry_run import dry_run, fail
from testbed.plan.model import Action, Op, Plan, Program, Worker
from testbed.topology.model import Topology


def validate_plan(plan: Plan, topology: Topology | None = None) -> None:
    """Raise PlanError naming the first problem; return quietly for a runnable plan."""
    _check_structure(plan, topology)
    for index, program in enumerate(plan.all_programs()):
        _check_program(plan, program, _program_name(plan, index))
        _check_pairs(plan, program)
    _check_fragments(plan)
    dry_run(plan, topology)


def _program_name(plan: Plan, index: int) -> str:
    return f"program {index}: " if plan.programs else ""


def _check_structure(plan: Plan, topology: Topology | None) -> None:
    if plan.dp < 1 or plan.pp < 1 or plan.tp < 1 or plan.microbatches < 1:
        raise fail("degrees dp, pp, tp and microbatches must all be at least 1")
    if len(plan.layers) != plan.pp or any(n < 1 for n in plan.layers):
        raise fail(f"needs a positive layer count for each of {plan.pp} stages, got {plan.layers}")
    if plan.programs and not plan.cycle:
        raise fail(f"{len(plan.programs) + 1} programs but no cycle saying which runs when")
    for index in plan.cycle:
        if not 0 <= index <= len(plan.programs):
            raise fail(f"the cycle names program {index}, the plan has programs 0 to "
                        f"{len(plan.programs)}")
    unused = set(range(len(plan.programs) + 1)) - set(plan.cycle or (0,))
    if unused:
        raise fail(f"program {min(unused)} is in no iteration of the cycle")
    expected = {(r, s) for r in range(plan.dp) for s in range(plan.pp)}
    missing = sorted(expected - set(plan.placement))
    if missing:
        raise fail(f"replica {missing[0][0]} stage {missing[0][1]} has no GPU")
    extra = sorted(set(plan.placement) - expected)
    if extra:
        raise fail(
            f"placement names replica {extra[0][0]} stage {extra[0][1]}, outside "
            f"dp={plan.dp} pp={plan.pp}"
        )
    owner: dict[str, Worker] = {}
    known = {gpu.name for gpu in topology.gpus()} if topology is not None else None
    for worker, gpus in plan.workers():
        if len(gpus) != plan.tp:
            raise fail(
                f"replica {worker[0]} stage {worker[1]} has {len(gpus)} GPUs, tp is {plan.tp}"
            )
        for gpu in gpus:
            if known is not None and gpu not in known:
                raise fail(f"GPU {gpu} is not in the topology")
            if gpu in owner:
                other = owner[gpu]
                raise fail(
                    f"GPU {gpu} is used by replica {other[0]} stage {other[1]} and by "
                    f"replica {worker[0]} stage {worker[1]}"
                )
            owner[gpu] = worker


def _check_program(plan: Plan, program: Program, name: str) -> None:
    owner = {gpu: worker for worker, gpus in plan.workers() for gpu in gpus}
    for gpu in program:
        if gpu not in owner:
            raise fail(f"{name}GPU {gpu} has actions but runs no stage")
    for worker, gpus in plan.workers():
        lists = [program.get(gpu) for gpu in gpus]
        if lists[0] is None:
            raise fail(f"{name}GPU {gpus[0]} has no actions")
        for gpu, actions in zip(gpus[1:], lists[1:], strict=True):
            if actions != lists[0]:
                raise fail(f"{name}GPU {gpu} differs from {gpus[0]} in its tensor-parallel "
                            "group")
        for action in lists[0]:
            where = f"{name}{gpus[0]}"
            if action.stage != worker[1]:
                raise fail(f"{where} runs stage {worker[1]} but lists {action}")
            mb = action.microbatch
            if mb is not None and not 0 <= mb < plan.microbatches:
                raise fail(f"{where}: {action} names microbatch {mb}, plan has "
                            f"{plan.microbatches}")
            if action.op in (Op.SEND_F, Op.RECV_B, Op.WAIT_F) and worker[1] == plan.pp - 1:
                raise fail(f"{where}: {action} on the last stage has no next stage")
            if action.op in (Op.SEND_B, Op.RECV_F, Op.WAIT_B) and worker[1] == 0:
                raise fail(f"{where}: {action} on the first stage has no previous stage")
            if action.op.is_collective:
                subject = action.subject
                if subject.reduces is Reduces.GRADIENTS and not subject.whole:
                    raise fail(f"{where}: {action}: gradients are all-reduced whole "
                                "(fragments are for parameter deltas)")


_MATCH = {Op.SEND_F: (Op.RECV_F, +1), Op.SEND_B: (Op.RECV_B, -1)}


def _check_pairs(plan: Plan, program: Program) -> None:
    """Every send has exactly one receive on the peer, and every receive one send."""
    for (replica, stage), gpus in plan.workers():
        lead = gpus[0]
        for op, (recv_op, step) in _MATCH.items():
            sends = Counter(a.microbatch for a in program[lead] if a.op is op)
            peer_stage = stage + step
            if not 0 <= peer_stage < plan.pp:
                continue
            peer = plan.lead_gpu(replica, peer_stage)
            recvs = Counter(a.microbatch for a in program[peer] if a.op is recv_op)
            for mb, count in sorted(sends.items(), key=lambda kv: kv[0] or 0):
                if recvs.get(mb, 0) < count:
                    raise fail(
                        f"unmatched send: {lead} {Action(stage, op, mb)} has no "
                        f"{Action(peer_stage, recv_op, mb)} on {peer}"
                    )
            for mb, count in sorted(recvs.items(), key=lambda kv: kv[0] or 0):
                if sends.get(mb, 0) < count:
                    raise fail(
                        f"unmatched receive: {peer} {Action(peer_stage, recv_op, mb)} "
                        f"has no {Action(stage, op, mb)} on {lead}"
                    )


def _check_fragments(plan: Plan) -> None:
    """A stage's deltas are cut into one number of fragments, so that fragments sync
    disjoint parts that together cover the parameters."""
    counts: dict[int, tuple[int, Action]] = {}
    for program in plan.all_programs():
        for (_, stage), gpus in plan.workers():
            for action in program[gpus[0]]:
                if not action.op.is_collective or action.subject.reduces is not Reduces.DELTAS:
                    continue
                n = action.subject.fragments
                first = counts.setdefault(stage, (n, action))
                if first[0] != n:
                    raise fail(f"stage {stage} cuts its deltas into {first[0]} fragments "
                                f"({first[1]}) and into {n} ({action})")
