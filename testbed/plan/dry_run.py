"""Run a plan's action lists without running anything, a cycle long.

Replicas must meet at every all-reduce with the same collective in the same iteration;
every started all-reduce is awaited within the cycle; replicas that step apart (no
all-reduce of their gradients across all replicas) must sync every fragment of their
parameters at least once per cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.errors import PlanError
from testbed.plan.collective import Collective, Reduces, Scope
from testbed.plan.model import Action, Op, Plan, Program, Worker
from testbed.topology.model import Topology


def dry_run(plan: Plan, topology: Topology | None) -> None:
    """PlanError for the first hang or divergence; `topology` places the replicas of
    collectives scoped to a datacenter."""
    _CycleRun(plan, _groups(plan, topology)).run()


def fail(message: str) -> PlanError:
    return PlanError(f"invalid plan: {message}")


GroupKey = tuple[int, Scope, str]
"""(stage, scope, datacenter or '' for all)."""


@dataclass
class _Groups:
    """Which replicas of a stage reduce together, by scope."""

    dc_of: Callable[[str], str] | None
    dp: int
    placement: dict[Worker, tuple[str, ...]]
    _members: dict[GroupKey, list[int]] = field(default_factory=dict)

    def key(self, worker: Worker, collective: Collective, gpu: str) -> GroupKey:
        if collective.scope is Scope.ALL:
            return (worker[1], Scope.ALL, "")
        if self.dc_of is None:
            raise fail(f"{gpu}: a collective among the replicas of a datacenter needs the "
                        "topology to know where replicas run")
        return (worker[1], Scope.DC, self.dc_of(gpu))

    def members(self, key: GroupKey) -> list[int]:
        if key not in self._members:
            stage, scope, dc = key
            dc_of = self.dc_of
            self._members[key] = list(range(self.dp)) if scope is Scope.ALL or dc_of is None \
                else [r for r in range(self.dp) if dc_of(self.placement[(r, stage)][0]) == dc]
        return self._members[key]

    def spans_all(self, key: GroupKey) -> bool:
        return len(self.members(key)) == self.dp


def _groups(plan: Plan, topology: Topology | None) -> _Groups:
    return _Groups(topology.dc_of if topology is not None else None, plan.dp,
                   dict(plan.placement))


@dataclass
class _State:
    """A worker within one iteration."""

    pc: int = 0
    forward: set[int] = field(default_factory=set)
    backward: set[int] = field(default_factory=set)
    got_input: set[int] = field(default_factory=set)
    got_grad: set[int] = field(default_factory=set)
    sent: set[tuple[Op, int]] = field(default_factory=set)
    """Sends not yet waited for."""
    reduced: bool = False
    """Its gradients were all-reduced across every replica before the step."""
    reduced_any: bool = False
    stepped: bool = False
    waiting: str = ""
    joined: int | None = None
    """The collective index a blocking action at `pc` has joined (so a retry does not
    join again)."""


@dataclass
class _Cycle:
    """A worker across the iterations of the cycle."""

    started: dict[Collective, tuple[GroupKey, int]] = field(default_factory=dict)
    """All-reduces started and not yet awaited: their group and index in it."""
    reduced_deltas: set[tuple[int, int]] = field(default_factory=set)
    """Fragments whose deltas were reduced across every replica, for an OUTER_STEP."""


class _CycleRun:
    """Each worker runs its lists in order, iteration after iteration of one cycle;
    receives and the waits of all-reduces block, sends do not (a send completes once
    delivered, so waiting for one never deadlocks). All-reduces meet by their index in
    their group: the k-th a replica starts is the k-th of every other member."""

    def __init__(self, plan: Plan, groups: _Groups) -> None:
        self.plan, self.groups = plan, groups
        self.lead = {worker: gpus[0] for worker, gpus in plan.workers()}
        self.cycle = {worker: _Cycle() for worker in self.lead}
        self.joins: dict[GroupKey, dict[int, list[tuple[Collective, int]]]] = {}
        """Per group, per replica: the (collective, iteration) of each it started."""
        self.apart: dict[int, Action] = {}
        """Stages whose replicas stepped without a common gradient: one such step."""
        self.synced: dict[int, set[int]] = {}
        """Per stage, the fragments an outer step brought together."""
        self.delta_syncs = {
            stage for program in plan.all_programs() for (_, stage), gpus in plan.workers()
            for a in program[gpus[0]]
            if a.op.is_collective and a.subject.reduces is Reduces.DELTAS
        }
        self.iteration = 0
        self.where: dict[Worker, str] = {}
        self.program: Program = plan.actions
        self.state: dict[Worker, _State] = {}
        self.mail: set[tuple[Op, int, int, int]] = set()

    def run(self) -> None:
        seen: set[object] = set()
        for iteration, index in enumerate(self.plan.cycle or (0,)):
            # an iteration that starts as an earlier one did runs as it did: skip it
            key = (index, tuple((w, tuple(sorted(map(str, c.started))),
                                 tuple(sorted(c.reduced_deltas)))
                                for w, c in sorted(self.cycle.items())))
            if key in seen:
                continue
            seen.add(key)
            self._run_iteration(iteration, self.plan.all_programs()[index])
        self._check_cycle_end()

    def _where(self, gpu: str) -> str:
        return f"{gpu} in iteration {self.iteration}" if self.plan.cycle else gpu

    def _run_iteration(self, iteration: int, program: Program) -> None:
        self.iteration, self.program = iteration, program
        self.where = {worker: self._where(gpu) for worker, gpu in self.lead.items()}
        self.state = {worker: _State() for worker in self.lead}
        self.mail = set()
        while True:
            progressed = False
            for worker in self.lead:
                progressed |= self._advance(worker)
            if all(self._finished(w) for w in self.lead):
                break
            if not progressed:
                self._report_deadlock()
        for worker, state in self.state.items():
            gpu = self._where(self.lead[worker])
            for mb in range(self.plan.microbatches):
                if mb not in state.forward:
                    raise fail(f"{gpu} never runs the forward of microbatch {mb}")
                if mb not in state.backward:
                    raise fail(f"{gpu} never runs the backward of microbatch {mb}")
            if not state.stepped:
                raise fail(f"{gpu} never runs the optimizer step")

    def _check_cycle_end(self) -> None:
        for worker, cycle in self.cycle.items():
            if cycle.started:
                collective = min(cycle.started)
                what = Action(worker[1], Op.ALLREDUCE_START, None, collective)
                raise fail(f"{self.lead[worker]}: {what} is never waited for (every "
                            "all-reduce started ends within the cycle)")
        for stage, step in sorted(self.apart.items()):
            gpu = self.lead[(0, stage)]
            if stage not in self.delta_syncs:
                raise fail(f"{gpu}: {step} before {Action(stage, Op.ALLREDUCE)}: replicas "
                            "would diverge")
            fragments = self._fragment_count(stage)
            missing = sorted(set(range(fragments)) - self.synced.get(stage, set()))
            if missing:
                raise fail(
                    f"{gpu}: replicas step apart and fragment {missing[0]} of {fragments} is "
                    f"never brought together by an {Op.OUTER_STEP.value} after an all-reduce "
                    "of its deltas across all replicas: replicas would diverge")

    def _fragment_count(self, stage: int) -> int:
        for program in self.plan.all_programs():
            for a in program[self.lead[(0, stage)]]:
                if a.op.is_collective and a.subject.reduces is Reduces.DELTAS:
                    return a.subject.fragments
        return 1

    def _finished(self, worker: Worker) -> bool:
        return self.state[worker].pc >= len(self.program[self.lead[worker]])

    def _advance(self, worker: Worker) -> bool:
        actions = self.program[self.lead[worker]]
        state = self.state[worker]
        moved = False
        while state.pc < len(actions):
            action = actions[state.pc]
            if not self._execute(worker, state, action):
                return moved
            state.pc += 1
            state.waiting = ""
            state.joined = None
            moved = True
        return moved

    def _execute(self, worker: Worker, state: _State, action: Action) -> bool:
        """Apply one action; False when it must wait, PlanError when it is wrong."""
        replica, stage = worker
        gpu = self.where[worker]
        last = self.plan.pp - 1
        mb = action.microbatch
        op = action.op
        if op is Op.F:
            assert mb is not None
            if mb in state.forward:
                raise fail(f"{gpu}: {action} runs a second time")
            if stage > 0 and mb not in state.got_input:
                raise fail(f"{gpu}: {action} runs before {Action(stage, Op.RECV_F, mb)}")
            state.forward.add(mb)
        elif op is Op.B:
            assert mb is not None
            if mb not in state.forward:
                raise fail(
                    f"{gpu}: backward before forward: {action} before {Action(stage, Op.F, mb)}"
                )
            if mb in state.backward:
                raise fail(f"{gpu}: {action} runs a second time")
            if stage < last and mb not in state.got_grad:
                raise fail(f"{gpu}: {action} runs before {Action(stage, Op.RECV_B, mb)}")
            state.backward.add(mb)
        elif op is Op.SEND_F:
            assert mb is not None
            if mb not in state.forward:
                raise fail(f"{gpu}: {action} sends before {Action(stage, Op.F, mb)} computed it")
            self.mail.add((Op.F, replica, stage + 1, mb))
            state.sent.add((Op.SEND_F, mb))
        elif op is Op.SEND_B:
            assert mb is not None
            if mb not in state.backward:
                raise fail(f"{gpu}: {action} sends before {Action(stage, Op.B, mb)} computed it")
            self.mail.add((Op.B, replica, stage - 1, mb))
            state.sent.add((Op.SEND_B, mb))
        elif op in (Op.WAIT_F, Op.WAIT_B):
            assert mb is not None
            send = Op.SEND_F if op is Op.WAIT_F else Op.SEND_B
            if (send, mb) not in state.sent:
                raise fail(f"{gpu}: {action} waits for {Action(stage, send, mb)}, which is not "
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
        elif op in (Op.ALLREDUCE, Op.ALLREDUCE_START, Op.ALLREDUCE_WAIT):
            return self._collective(worker, state, action, gpu)
        elif op is Op.OUTER_STEP:
            fragment = (action.subject.fragment, action.subject.fragments)
            cycle = self.cycle[worker]
            if fragment not in cycle.reduced_deltas:
                raise fail(f"{gpu}: {action} before an all-reduce of fragment "
                            f"{fragment[0]} of {fragment[1]}'s deltas across all replicas "
                            "has ended")
            cycle.reduced_deltas.discard(fragment)
            self.synced.setdefault(stage, set()).add(fragment[0])
        elif op is Op.STEP:
            if len(state.backward) < self.plan.microbatches:
                raise fail(f"{gpu}: {action} before all backwards finished")
            if state.stepped:
                raise fail(f"{gpu}: {action} runs a second time in one iteration")
            if self.plan.dp > 1 and not state.reduced:
                self.apart.setdefault(stage, action)
            state.stepped = True
        return True

    def _collective(self, worker: Worker, state: _State, action: Action, gpu: str) -> bool:
        """Join, start or await an all-reduce; False while it waits for other members."""
        subject = action.subject
        cycle = self.cycle[worker]
        if subject.reduces is Reduces.GRADIENTS and action.op is not Op.ALLREDUCE_WAIT and (
                len(state.backward) < self.plan.microbatches):
            raise fail(f"{gpu}: {action} before all backwards finished")
        if action.op is Op.ALLREDUCE_WAIT:
            if subject not in cycle.started:
                raise fail(f"{gpu}: {action} waits for an all-reduce this stage has not "
                            "started (or already waited for)")
            group, index = cycle.started[subject]
        elif state.joined is not None:
            group, index = self.groups.key(worker, subject, self.lead[worker]), state.joined
        else:
            if subject in cycle.started:
                raise fail(f"{gpu}: {action} starts an all-reduce already under way")
            group = self.groups.key(worker, subject, self.lead[worker])
            index = self._join(worker, group, subject, gpu, action)
            state.joined = index
            if action.op is Op.ALLREDUCE_START:
                cycle.started[subject] = (group, index)
                return True
        arrived = self.joins[group]
        if any(len(arrived.get(r, [])) <= index for r in self.groups.members(group)):
            state.waiting = str(action)
            return False
        cycle.started.pop(subject, None)
        if subject.reduces is Reduces.GRADIENTS:
            state.reduced_any = True
            state.reduced = state.reduced or self.groups.spans_all(group)
        elif self.groups.spans_all(group):
            cycle.reduced_deltas.add((subject.fragment, subject.fragments))
        return True

    def _join(self, worker: Worker, group: GroupKey, subject: Collective, gpu: str,
              action: Action) -> int:
        """This replica's next all-reduce in `group`: the same as every other member's
        in the same place, or a PlanError saying how they differ."""
        arrived = self.joins.setdefault(group, {})
        mine = arrived.setdefault(worker[0], [])
        index = len(mine)
        mine.append((subject, self.iteration))
        for replica, theirs in arrived.items():
            if replica != worker[0] and len(theirs) > index and theirs[index] != mine[index]:
                other, when = theirs[index]
                peer = self.lead[(replica, worker[1])]
                raise fail(
                    f"{gpu}: {action} meets {peer}'s "
                    f"{Action(worker[1], Op.ALLREDUCE, None, other)} (iteration {when}): "
                    "replicas must reduce the same collective in the same iteration")
        return index

    def _report_deadlock(self) -> None:
        stuck = [(w, s) for w, s in self.state.items() if not self._finished(w)]
        worker, state = stuck[0]
        gpu = self._where(self.lead[worker])
        action = self.program[self.lead[worker]][state.pc]
        if action.op.is_collective:
            subject = action.subject
            if action.op is Op.ALLREDUCE_WAIT:
                group, index = self.cycle[worker].started[subject]
            else:
                group = self.groups.key(worker, subject, self.lead[worker])
                index = state.joined if state.joined is not None else 0
            arrived = self.joins.get(group, {})
            absent = [r for r in self.groups.members(group) if len(arrived.get(r, [])) <= index]
            other = (absent[0], worker[1])
            other_state = self.state[other]
            raise fail(
                f"deadlock: {gpu} waits at {action} for {self.lead[other]}, which waits at "
                f"{other_state.waiting or 'an earlier action'}"
            )
        step = -1 if action.op is Op.RECV_F else 1
        peer = (worker[0], worker[1] + step)
        peer_gpu = self.lead[peer]
        peer_state = self.state[peer]
        peer_at = (
            self.program[peer_gpu][peer_state.pc] if not self._finished(peer) else "its end"
        )
        raise fail(f"deadlock: {gpu} waits at {action} for {peer_gpu}, which waits at {peer_at}")
