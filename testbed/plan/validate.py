"""Dry-run a plan and name the first thing that would hang or corrupt training."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from testbed.errors import PlanError
from testbed.plan.model import Action, Op, Plan, Worker
from testbed.topology.model import Topology


def validate_plan(plan: Plan, topology: Topology | None = None) -> None:
    """Raise PlanError naming the first problem; return quietly for a runnable plan."""
    _check_structure(plan, topology)
    _check_pairs(plan)
    _DryRun(plan).run()


def _fail(message: str) -> PlanError:
    return PlanError(f"invalid plan: {message}")


def _check_structure(plan: Plan, topology: Topology | None) -> None:
    if plan.dp < 1 or plan.pp < 1 or plan.tp < 1 or plan.microbatches < 1:
        raise _fail("degrees dp, pp, tp and microbatches must all be at least 1")
    if len(plan.layers) != plan.pp or any(n < 1 for n in plan.layers):
        raise _fail(f"needs a positive layer count for each of {plan.pp} stages, got {plan.layers}")
    expected = {(r, s) for r in range(plan.dp) for s in range(plan.pp)}
    missing = sorted(expected - set(plan.placement))
    if missing:
        raise _fail(f"replica {missing[0][0]} stage {missing[0][1]} has no GPU")
    extra = sorted(set(plan.placement) - expected)
    if extra:
        raise _fail(
            f"placement names replica {extra[0][0]} stage {extra[0][1]}, outside "
            f"dp={plan.dp} pp={plan.pp}"
        )
    owner: dict[str, Worker] = {}
    known = {gpu.name for gpu in topology.gpus()} if topology is not None else None
    for worker, gpus in plan.workers():
        if len(gpus) != plan.tp:
            raise _fail(
                f"replica {worker[0]} stage {worker[1]} has {len(gpus)} GPUs, tp is {plan.tp}"
            )
        for gpu in gpus:
            if known is not None and gpu not in known:
                raise _fail(f"GPU {gpu} is not in the topology")
            if gpu in owner:
                other = owner[gpu]
                raise _fail(
                    f"GPU {gpu} is used by replica {other[0]} stage {other[1]} and by "
                    f"replica {worker[0]} stage {worker[1]}"
                )
            owner[gpu] = worker
    for gpu in plan.actions:
        if gpu not in owner:
            raise _fail(f"GPU {gpu} has actions but runs no stage")
    for worker, gpus in plan.workers():
        lists = [plan.actions.get(gpu) for gpu in gpus]
        if lists[0] is None:
            raise _fail(f"GPU {gpus[0]} has no actions")
        for gpu, actions in zip(gpus[1:], lists[1:], strict=True):
            if actions != lists[0]:
                raise _fail(f"GPU {gpu} differs from {gpus[0]} in its tensor-parallel group")
        for action in lists[0]:
            if action.stage != worker[1]:
                raise _fail(f"{gpus[0]} runs stage {worker[1]} but lists {action}")
            mb = action.microbatch
            if mb is not None and not 0 <= mb < plan.microbatches:
                raise _fail(
                    f"{gpus[0]}: {action} names microbatch {mb}, plan has {plan.microbatches}"
                )
            if action.op in (Op.SEND_F, Op.RECV_B, Op.WAIT_F) and worker[1] == plan.pp - 1:
                raise _fail(f"{gpus[0]}: {action} on the last stage has no next stage")
            if action.op in (Op.SEND_B, Op.RECV_F, Op.WAIT_B) and worker[1] == 0:
                raise _fail(f"{gpus[0]}: {action} on the first stage has no previous stage")


_MATCH = {Op.SEND_F: (Op.RECV_F, +1), Op.SEND_B: (Op.RECV_B, -1)}


def _check_pairs(plan: Plan) -> None:
    """Every send has exactly one receive on the peer, and every receive one send."""
    for (replica, stage), gpus in plan.workers():
        lead = gpus[0]
        for op, (recv_op, step) in _MATCH.items():
            sends = Counter(a.microbatch for a in plan.actions[lead] if a.op is op)
            peer_stage = stage + step
            if not 0 <= peer_stage < plan.pp:
                continue
            peer = plan.lead_gpu(replica, peer_stage)
            recvs = Counter(a.microbatch for a in plan.actions[peer] if a.op is recv_op)
            for mb, count in sorted(sends.items(), key=lambda kv: kv[0] or 0):
                if recvs.get(mb, 0) < count:
                    raise _fail(
                        f"unmatched send: {lead} {Action(stage, op, mb)} has no "
                        f"{Action(peer_stage, recv_op, mb)} on {peer}"
                    )
            for mb, count in sorted(recvs.items(), key=lambda kv: kv[0] or 0):
                if sends.get(mb, 0) < count:
                    raise _fail(
                        f"unmatched receive: {peer} {Action(peer_stage, recv_op, mb)} "
                        f"has no {Action(stage, op, mb)} on {lead}"
                    )


@dataclass
class _State:
    pc: int = 0
    forward: set[int] = field(default_factory=set)
    backward: set[int] = field(default_factory=set)
    got_input: set[int] = field(default_factory=set)
    got_grad: set[int] = field(default_factory=set)
    sent: set[tuple[Op, int]] = field(default_factory=set)
    """Sends not yet waited for."""
    reduced: bool = False
    stepped: bool = False
    waiting: str = ""


class _DryRun:
    """Each worker runs its list in order; receives and the all-reduce block, sends do not
    (a send completes once delivered, so waiting for one never deadlocks)."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.lead = {worker: gpus[0] for worker, gpus in plan.workers()}
        self.state = {worker: _State() for worker in self.lead}
        self.mail: set[tuple[Op, int, int, int]] = set()
        self.at_allreduce: dict[int, set[int]] = {s: set() for s in range(plan.pp)}
        self.released: dict[int, bool] = dict.fromkeys(range(plan.pp), False)

    def run(self) -> None:
        while True:
            progressed = False
            for worker in self.lead:
                progressed |= self._advance(worker)
            if all(self._finished(w) for w in self.lead):
                break
            if not progressed:
                self._report_deadlock()
        for worker, state in self.state.items():
            gpu = self.lead[worker]
            for mb in range(self.plan.microbatches):
                if mb not in state.forward:
                    raise _fail(f"{gpu} never runs the forward of microbatch {mb}")
                if mb not in state.backward:
                    raise _fail(f"{gpu} never runs the backward of microbatch {mb}")
            if not state.stepped:
                raise _fail(f"{gpu} never runs the optimizer step")

    def _finished(self, worker: Worker) -> bool:
        return self.state[worker].pc >= len(self.plan.actions[self.lead[worker]])

    def _advance(self, worker: Worker) -> bool:
        actions = self.plan.actions[self.lead[worker]]
        state = self.state[worker]
        moved = False
        while state.pc < len(actions):
            action = actions[state.pc]
            if not self._execute(worker, state, action):
                return moved
            state.pc += 1
            state.waiting = ""
            moved = True
        return moved

    def _execute(self, worker: Worker, state: _State, action: Action) -> bool:
        """Apply one action; False when it must wait, PlanError when it is wrong."""
        replica, stage = worker
        gpu = self.lead[worker]
        last = self.plan.pp - 1
        mb = action.microbatch
        op = action.op
        if op is Op.F:
            assert mb is not None
            if mb in state.forward:
                raise _fail(f"{gpu}: {action} runs a second time")
            if stage > 0 and mb not in state.got_input:
                raise _fail(f"{gpu}: {action} runs before {Action(stage, Op.RECV_F, mb)}")
            state.forward.add(mb)
        elif op is Op.B:
            assert mb is not None
            if mb not in state.forward:
                raise _fail(
                    f"{gpu}: backward before forward: {action} before {Action(stage, Op.F, mb)}"
                )
            if mb in state.backward:
                raise _fail(f"{gpu}: {action} runs a second time")
            if stage < last and mb not in state.got_grad:
                raise _fail(f"{gpu}: {action} runs before {Action(stage, Op.RECV_B, mb)}")
            state.backward.add(mb)
        elif op is Op.SEND_F:
            assert mb is not None
            if mb not in state.forward:
                raise _fail(f"{gpu}: {action} sends before {Action(stage, Op.F, mb)} computed it")
            self.mail.add((Op.F, replica, stage + 1, mb))
            state.sent.add((Op.SEND_F, mb))
        elif op is Op.SEND_B:
            assert mb is not None
            if mb not in state.backward:
                raise _fail(f"{gpu}: {action} sends before {Action(stage, Op.B, mb)} computed it")
            self.mail.add((Op.B, replica, stage - 1, mb))
            state.sent.add((Op.SEND_B, mb))
        elif op in (Op.WAIT_F, Op.WAIT_B):
            assert mb is not None
            send = Op.SEND_F if op is Op.WAIT_F else Op.SEND_B
            if (send, mb) not in state.sent:
                raise _fail(f"{gpu}: {action} waits for {Action(stage, send, mb)}, which is not "
                            "sent before it or was already waited for")
            state.sent.discard((send, mb))
        elif op in (Op.RECV_F, Op.RECV_B):
            assert mb is not None
            kind = Op.F if op is Op.RECV_F else Op.B
            key = (kind, replica, stage, mb)
            if key not in self.mail:
                state.waiting = str(action)
                return False
            self.mail.discard(key)
            (state.got_input if kind is Op.F else state.got_grad).add(mb)
        elif op is Op.ALLREDUCE:
            if len(state.backward) < self.plan.microbatches:
                raise _fail(f"{gpu}: {action} before all backwards finished")
            arrived = self.at_allreduce[stage]
            arrived.add(replica)
            if len(arrived) < self.plan.dp and not self.released[stage]:
                state.waiting = str(action)
                return False
            self.released[stage] = True
            state.reduced = True
        elif op is Op.STEP:
            if len(state.backward) < self.plan.microbatches:
                raise _fail(f"{gpu}: {action} before all backwards finished")
            if self.plan.dp > 1 and not state.reduced:
                raise _fail(
                    f"{gpu}: {action} before {Action(stage, Op.ALLREDUCE)}: replicas would diverge"
                )
            state.stepped = True
        return True

    def _report_deadlock(self) -> None:
        stuck = [(w, s) for w, s in self.state.items() if not self._finished(w)]
        worker, state = stuck[0]
        gpu = self.lead[worker]
        action = self.plan.actions[gpu][state.pc]
        if action.op is Op.ALLREDUCE:
            absent = [r for r in range(self.plan.dp) if r not in self.at_allreduce[worker[1]]]
            other = self.lead[(absent[0], worker[1])]
            other_state = self.state[(absent[0], worker[1])]
            raise _fail(
                f"deadlock: {gpu} waits at {action} for {other}, which waits at "
                f"{other_state.waiting or 'an earlier action'}"
            )
        step = -1 if action.op is Op.RECV_F else 1
        peer = (worker[0], worker[1] + step)
        peer_gpu = self.lead[peer]
        peer_state = self.state[peer]
        peer_at = (
            self.plan.actions[peer_gpu][peer_state.pc] if not self._finished(peer) else "its end"
        )
        raise _fail(f"deadlock: {gpu} waits at {action} for {peer_gpu}, which waits at {peer_at}")
