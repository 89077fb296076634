"""Check a plan's shape, then dry-run it (testbed.plan.dry_run), naming the first thing
that would hang or corrupt training."""

from __future__ import annotations

from collections import Counter

from testbed.plan.collective import Reduces
from testbed.plan.dry_run import dry_run
from testbed.plan.interpret import backward_of
from testbed.plan.model import Action, Op, Plan, Program, Worker
from testbed.plan.stage_rules import fail
from testbed.plan.tcp_model import HostLimits
from testbed.topology.model import Topology


def validate_plan(plan: Plan, topology: Topology | None = None,
                  limits: HostLimits | None = None) -> None:
    """Raise PlanError naming the first problem; return quietly for a runnable plan.
    `limits`: what the hosts allow a worker's connections (Linux's defaults if not
    given), as the policies choose within them."""
    _check_structure(plan, topology)
    if topology is not None:
        _check_connections(plan, topology, limits or HostLimits())
    for index, program in enumerate(plan.all_programs()):
        _check_program(plan, program, _program_name(plan, index))
        _check_pairs(plan, program)
    _check_fragments(plan)
    dry_run(plan, topology)


def _program_name(plan: Plan, index: int) -> str:
    return f"program {index}: " if plan.programs else ""


def _check_structure(plan: Plan, topology: Topology | None) -> None:
    _check_shape(plan)
    _check_cycle(plan)
    _check_placement(plan, topology)
    _check_sharing(plan, topology)
    _check_virtual(plan)


def _check_shape(plan: Plan) -> None:
    """The degrees and each stage's layers."""
    if plan.dp < 1 or plan.pp < 1 or plan.tp < 1 or plan.microbatches < 1:
        raise fail("degrees dp, pp, tp and microbatches must all be at least 1")
    if len(plan.layers) != plan.pp or any(n < 1 for n in plan.layers):
        raise fail(f"needs a positive layer count for each of {plan.pp} stages, got {plan.layers}")


def _check_cycle(plan: Plan) -> None:
    """Which program runs when: every one named exists, and runs."""
    if plan.programs and not plan.cycle:
        raise fail(f"{len(plan.programs) + 1} programs but no cycle saying which runs when")
    for name, listed in (("cycle", plan.cycle), ("opening", plan.opening)):
        for index in listed:
            if not 0 <= index <= len(plan.programs):
                raise fail(f"the {name} names program {index}, the plan has programs 0 to "
                            f"{len(plan.programs)}")
    if plan.opening and len(plan.opening) != plan.period:
        raise fail(f"the opening cycle has {len(plan.opening)} iterations, the cycle "
                    f"{plan.period}")
    unused = set(range(len(plan.programs) + 1)) - set(plan.cycle or (0,)) - set(plan.opening)
    if unused:
        raise fail(f"program {min(unused)} is in no iteration of the cycle")


def _check_placement(plan: Plan, topology: Topology | None) -> None:
    """Every (replica, stage) on tp GPUs of the topology; a GPU holds stages of one replica
    only, each in the same tensor-parallel group."""
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
    owner: dict[str, tuple[Worker, tuple[str, ...]]] = {}
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
                _check_shared_gpu(gpu, owner[gpu], (worker, gpus))
            else:
                owner[gpu] = (worker, gpus)


def _check_sharing(plan: Plan, topology: Topology | None) -> None:
    """Every DC pair the plan says how it shares is two of the topology's DCs: what reads
    the pairs (the WAN queues' check, the runtimes) routes between them."""
    if topology is None:
        return
    names = [dc.name for dc in topology.datacenters]
    for pair in plan.sharing:
        for dc in pair:
            if dc not in names:
                raise fail(f"sharing names DC {dc!r} of {pair[0]}>{pair[1]}, not one of the "
                           f"topology's ({', '.join(names)})")


def _check_shared_gpu(gpu: str, first: tuple[Worker, tuple[str, ...]],
                      then: tuple[Worker, tuple[str, ...]]) -> None:
    """A second stage on `gpu`: of the same replica, in the same tensor-parallel group."""
    (other, group), (worker, gpus) = first, then
    if other[0] != worker[0]:
        raise fail(
            f"GPU {gpu} is used by replica {other[0]} stage {other[1]} and by "
            f"replica {worker[0]} stage {worker[1]}"
        )
    if group != gpus:
        raise fail(f"GPU {gpu} holds stages {other[1]} and {worker[1]} of replica "
                    f"{worker[0]} in different tensor-parallel groups "
                    f"({', '.join(group)} and {', '.join(gpus)})")


def _check_connections(plan: Plan, topology: Topology, limits: HostLimits) -> None:
    """Each pair's connections within what the hosts allow a worker to one peer, by open
    files and TCP memory: the bound a policy choosing them is held to (Atlas's
    connections_to_fill), checked at whichever end allows more. A host's bound follows
    from its datacenter's send buffers alone, so it is worked out once per datacenter
    (a plan at thousands of GPUs has tens of thousands of pairs)."""
    dc_of = {gpu.name: gpu.dc for gpu in topology.gpus()}
    buffers = {dc.name: topology.tcp_for(dc.name).wmem[2] for dc in topology.datacenters}
    allowed = {dc: limits.connections_per_peer(size) for dc, size in buffers.items()}
    for (a, b), count in sorted(plan.connections.items()):
        for gpu in (a, b):
            if gpu not in dc_of:
                raise fail(f"connections between {a} and {b}: GPU {gpu} is not in the "
                           "topology")
        if count < 1:
            raise fail(f"{a} and {b} have {count} TCP connections between them; at least 1")
        if count > allowed[dc_of[a]] and count > allowed[dc_of[b]]:
            most = max(dc_of[a], dc_of[b], key=lambda dc: allowed[dc])
            raise fail(f"{a} and {b} have {count:,} TCP connections between them; a worker "
                       f"here may open at most {allowed[most]:,} to one peer "
                       f"({limits.describe(buffers[most])})")


def _check_virtual(plan: Plan) -> None:
    """Every GPU holds as many stages (virtual stages are a multiple of the GPUs)."""
    counts = {gpu: plan.stages_of(gpu) for gpu in plan.used_gpus()}
    first = next(iter(counts))
    for gpu, stages in counts.items():
        if len(stages) != len(counts[first]):
            raise fail(f"GPU {gpu} holds {_stages(stages)}, GPU {first} "
                        f"{_stages(counts[first])}: every GPU of a plan holds as many stages")


def _stages(stages: tuple[int, ...]) -> str:
    return f"stage {stages[0]}" if len(stages) == 1 else \
        f"stages {', '.join(map(str, stages))}"


def _groups(plan: Plan) -> list[tuple[int, tuple[int, ...], tuple[str, ...]]]:
    """(replica, stages held, GPUs) of every tensor-parallel group, once."""
    seen: dict[tuple[str, ...], tuple[int, tuple[int, ...], tuple[str, ...]]] = {}
    for (replica, _), gpus in plan.workers():
        seen.setdefault(gpus, (replica, plan.stages_of(gpus[0]), gpus))
    return list(seen.values())


def _check_program(plan: Plan, program: Program, name: str) -> None:
    used = set(plan.used_gpus())
    for gpu in program:
        if gpu not in used:
            raise fail(f"{name}GPU {gpu} has actions but runs no stage")
    checked: set[tuple[int, tuple[int, ...]]] = set()  # replicas share lists (build_plan)
    for _replica, stages, gpus in _groups(plan):
        lists = [program.get(gpu) for gpu in gpus]
        if lists[0] is None:
            raise fail(f"{name}GPU {gpus[0]} has no actions")
        for gpu, actions in zip(gpus[1:], lists[1:], strict=True):
            if actions is not lists[0] and actions != lists[0]:
                raise fail(f"{name}GPU {gpu} differs from {gpus[0]} in its tensor-parallel "
                            "group")
        if (id(lists[0]), stages) in checked:
            continue
        checked.add((id(lists[0]), stages))
        where = f"{name}{gpus[0]}"
        for action in lists[0]:
            for leaf in action.leaves:
                _check_action(plan, leaf, stages, where)
        _check_in_backward(lists[0], where)


def _check_action(plan: Plan, action: Action, stages: tuple[int, ...], where: str) -> None:
    if action.stage not in stages:
        raise fail(f"{where} runs {_stages(stages)} but lists {action}")
    mb = action.microbatch
    if mb is not None and not 0 <= mb < plan.microbatches:
        raise fail(f"{where}: {action} names microbatch {mb}, plan has "
                    f"{plan.microbatches}")
    if action.op.needs_microbatch and mb is None:
        raise fail(f"{where}: {action} needs a microbatch number")
    if action.op in (Op.SEND_F, Op.RECV_B, Op.WAIT_F) and action.stage == plan.pp - 1:
        raise fail(f"{where}: {action} on the last stage has no next stage")
    if action.op in (Op.SEND_B, Op.RECV_F, Op.WAIT_B) and action.stage == 0:
        raise fail(f"{where}: {action} on the first stage has no previous stage")
    if action.op.is_collective:
        subject = action.subject
        if subject.reduces is Reduces.GRADIENTS and not subject.whole:
            raise fail(f"{where}: {action}: gradients are all-reduced whole "
                        "(fragments are for parameter deltas)")


def _check_in_backward(actions: tuple[Action, ...], where: str) -> None:
    """A delta sync that starts in the backward takes its inner step there (ReduceStart):
    not where the stage's gradients are reduced first, after the backward."""
    for index in backward_of(actions):
        start = actions[index]
        if start.subject.reduces is not Reduces.DELTAS:
            continue
        reduced = next((a for a in actions if a.op.is_collective and a.stage == start.stage
                        and a.op is not Op.OUTER_STEP
                        and a.subject.reduces is Reduces.GRADIENTS), None)
        if reduced is not None:
            raise fail(f"{where}: {start} starts in the backward, where its parameters take "
                        f"their inner step, but the stage's gradients are reduced ({reduced}) "
                        "after the backward: start the deltas after the step")


_MATCH = {Op.SEND_F: (Op.RECV_F, +1), Op.SEND_B: (Op.RECV_B, -1)}


def _check_pairs(plan: Plan, program: Program) -> None:
    """Every send has exactly one receive on the peer, and every receive one send."""
    checked: set[tuple[int, int, Op, int]] = set()
    for (replica, stage), gpus in plan.workers():
        lead = gpus[0]
        for op, (recv_op, step) in _MATCH.items():
            peer_stage = stage + step
            if not 0 <= peer_stage < plan.pp:
                continue
            peer = plan.lead_gpu(replica, peer_stage)
            lists = (id(program[lead]), id(program[peer]), op, stage)  # the same lists
            if lists in checked:
                continue
            checked.add(lists)
            sends = Counter(a.microbatch for a in program[lead]
                            if a.op is op and a.stage == stage)
            recvs = Counter(a.microbatch for a in program[peer]
                            if a.op is recv_op and a.stage == peer_stage)
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
        lists = {(id(program[gpus[0]]), stage): program[gpus[0]]
                 for (_, stage), gpus in plan.workers()}  # a stage's replicas share one
        for (_, stage), actions in lists.items():
            for action in actions:
                if not action.op.is_collective or action.subject.reduces is not Reduces.DELTAS \
                        or action.stage != stage:
                    continue
                n = action.subject.fragments
                first = counts.setdefault(stage, (n, action))
                if first[0] != n:
                    raise fail(f"stage {stage} cuts its deltas into {first[0]} fragments "
                                f"({first[1]}) and into {n} ({action})")
