"""Run a plan's action lists without running anything, a cycle long (its opening cycle,
then one cycle after it, where the plan has an opening).

Replicas must meet at every all-reduce with the same collective in the same iteration;
every started all-reduce is awaited within the cycle (or, where the plan has an opening,
a cycle leaves under way what it found: a sync crossing the cycle's end); replicas that
step apart (no all-reduce of their gradients across all replicas) must sync every
fragment of their parameters at least once per cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.plan.collective import Collective, Reduces, Scope
from testbed.plan.model import Action, Op, Plan, Program, Worker
from testbed.plan.stage_rules import Mail, StageState, apply, check_complete, fail
from testbed.topology.model import Topology


def dry_run(plan: Plan, topology: Topology | None) -> None:
    """PlanError for the first hang or divergence; `topology` places the replicas of
    collectives scoped to a datacenter."""
    _CycleRun(plan, _groups(plan, topology)).run()


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
class _Runner:
    """A GPU (the lead of its tensor-parallel group) within one iteration: it runs the
    actions of every stage it holds, in one list."""

    replica: int
    stages: tuple[int, ...]
    pc: int = 0
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


@dataclass
class _Outcome:
    """What running one iteration did: each worker's state after it, the fragments it
    synced and the stages it found stepping apart."""

    cycles: dict[Worker, tuple[dict[Collective, tuple[GroupKey, int]], set[tuple[int, int]]]]
    synced: dict[int, set[int]]
    apart: dict[int, Action]


class _CycleRun:
    """Each GPU runs its list in order, iteration after iteration of one cycle; receives
    and the waits of all-reduces block, sends do not (a send completes once delivered, so
    waiting for one never deadlocks). All-reduces meet by their index in their group: the
    k-th a replica starts is the k-th of every other member.

    Replicas alike (the same action lists, by identity, on every stage in every program,
    in the same datacenters) run alike: only the first of each such class runs, and its
    copies join every collective with it (a plan at 8,192 GPUs has 64 replicas alike)."""

    def __init__(self, plan: Plan, groups: _Groups) -> None:
        self.plan, self.groups = plan, groups
        self.copies = _copies(plan, groups)
        """Per replica that runs, the replicas alike that it stands for."""
        self.lead = {worker: gpus[0] for worker, gpus in plan.workers()
                     if worker[0] in self.copies}
        self.held: dict[str, tuple[int, tuple[int, ...]]] = {
            gpu: (replica, plan.stages_of(gpu)) for (replica, _), gpu in self.lead.items()}
        """Per lead GPU that runs: its replica and the stages it holds."""
        self.name_stages = plan.stages_per_gpu > 1
        self.cycle = {worker: _Cycle() for worker in self.lead}
        self.joins: dict[GroupKey, dict[int, list[tuple[Collective, int]]]] = {}
        """Per group, per replica: the (collective, iteration) of each it started."""
        self.apart: dict[int, Action] = {}
        """Stages whose replicas stepped without a common gradient: one such step."""
        self.synced: dict[int, set[int]] = {}
        """Per stage, the fragments an outer step brought together."""
        lists = {id(program[gpu]): program[gpu] for program in plan.all_programs()
                 for gpu in self.held}  # a stage's replicas share one
        self.delta_syncs = {
            a.stage for actions in lists.values() for a in actions
            if a.op.is_collective and a.subject.reduces is Reduces.DELTAS
        }
        self.iteration = 0
        self.program: Program = plan.actions
        self.runners: dict[str, _Runner] = {}
        self.state: dict[Worker, StageState] = {}
        self.mail: Mail = set()

    def run(self) -> None:
        seen: dict[object, _Outcome] = {}
        plan = self.plan
        self._run_cycle(plan.opening or plan.cycle or (0,), seen)
        if not plan.opening:
            self._check_cycle_end({worker: set() for worker in self.cycle})
            return
        found = {worker: set(c.started) for worker, c in self.cycle.items()}
        self.synced = {}
        self._run_cycle(plan.cycle, seen)
        self._check_cycle_end(found)

    def _run_cycle(self, programs: tuple[int, ...], seen: dict[object, _Outcome]) -> None:
        for iteration, index in enumerate(programs):
            # an iteration that starts as an earlier one did runs as it did: take its outcome
            key = (index, tuple((w, tuple(sorted(map(str, c.started))),
                                 tuple(sorted(c.reduced_deltas)))
                                for w, c in sorted(self.cycle.items())))
            outcome = seen.get(key)
            if outcome is None:
                synced = {stage: set(found) for stage, found in self.synced.items()}
                apart = set(self.apart)
                self._run_iteration(iteration, self.plan.all_programs()[index])
                outcome = seen[key] = _Outcome(
                    {w: (dict(c.started), set(c.reduced_deltas)) for w, c in self.cycle.items()},
                    {stage: found - synced.get(stage, set())
                     for stage, found in self.synced.items()},
                    {stage: step for stage, step in self.apart.items() if stage not in apart})
            for worker, (started, reduced) in outcome.cycles.items():
                self.cycle[worker] = _Cycle(dict(started), set(reduced))
            for stage, fragments in outcome.synced.items():
                self.synced.setdefault(stage, set()).update(fragments)
            for stage, step in outcome.apart.items():
                self.apart.setdefault(stage, step)

    def _where(self, gpu: str) -> str:
        return f"{gpu} in iteration {self.iteration}" if self.plan.cycle else gpu

    def _run_iteration(self, iteration: int, program: Program) -> None:
        self.iteration, self.program = iteration, program
        self.runners = {gpu: _Runner(replica, stages)
                        for gpu, (replica, stages) in self.held.items()}
        self.state = {worker: StageState() for worker in self.lead}
        self.mail = set()
        while True:
            progressed = False
            for gpu in self.runners:
                progressed |= self._advance(gpu)
            if all(self._finished(gpu) for gpu in self.runners):
                break
            if not progressed:
                self._report_deadlock()
        for worker, state in self.state.items():
            check_complete(state, self.plan.microbatches, self._where(self.lead[worker]),
                           worker[1], self.name_stages)

    def _check_cycle_end(self, found: dict[Worker, set[Collective]]) -> None:
        """The cycle leaves under way what it found (nothing, but where the plan has an
        opening), and every stage that steps apart synced every fragment."""
        for worker, cycle in self.cycle.items():
            extra = set(cycle.started) - found[worker]
            if extra:
                what = Action(worker[1], Op.ALLREDUCE_START, None, min(extra))
                raise fail(f"{self.lead[worker]}: {what} is never waited for (every "
                            "all-reduce started ends within the cycle"
                            + (", or the next cycle starts it again)" if found[worker]
                               or self.plan.opening else ")"))
            gone = found[worker] - set(cycle.started)
            if gone:
                what = Action(worker[1], Op.ALLREDUCE_START, None, min(gone))
                raise fail(f"{self.lead[worker]}: {what} is under way as the cycle starts "
                            "and not as it ends: the opening cycle and the cycle disagree")
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
                if a.op.is_collective and a.stage == stage \
                        and a.subject.reduces is Reduces.DELTAS:
                    return a.subject.fragments
        return 1

    def _finished(self, gpu: str) -> bool:
        return self.runners[gpu].pc >= len(self.program[gpu])

    def _advance(self, gpu: str) -> bool:
        actions = self.program[gpu]
        runner = self.runners[gpu]
        moved = False
        while runner.pc < len(actions):
            action = actions[runner.pc]
            if not self._execute(gpu, runner, action):
                runner.waiting = str(action)
                return moved
            runner.pc += 1
            runner.waiting = ""
            runner.joined = None
            moved = True
        return moved

    def _execute(self, gpu: str, runner: _Runner, action: Action) -> bool:
        """Apply one action; False when it must wait, PlanError when it is wrong."""
        where = self._where(gpu)
        if action.op.is_collective and action.op is not Op.OUTER_STEP:
            return self._collective(gpu, runner, action, where)
        if action.op is Op.PREFILL:
            return True
        if action.op is Op.OUTER_STEP:
            self._outer_step((runner.replica, action.stage), action, where)
        elif action.op is Op.STEP:
            self._step((runner.replica, action.stage), action, where)
        else:
            last = self.plan.pp - 1
            return all([apply(self.state[(runner.replica, leaf.stage)], leaf, runner.replica,
                              last, where, self.mail) for leaf in action.leaves])
        return True

    def _outer_step(self, worker: Worker, action: Action, where: str) -> None:
        fragment = (action.subject.fragment, action.subject.fragments)
        cycle = self.cycle[worker]
        if self.plan.outer.eager:
            started = [c for c, (group, _) in cycle.started.items()
                       if c.reduces is Reduces.DELTAS and self.groups.spans_all(group)
                       and (c.fragment, c.fragments) == fragment]
            if not started:
                raise fail(f"{where}: eager {action} before this fragment's sync across "
                            "all replicas started (an eager outer step takes the fresh "
                            "deltas as its sync starts)")
            cycle.reduced_deltas.discard(fragment)
            self.synced.setdefault(worker[1], set()).add(fragment[0])
            return
        if fragment not in cycle.reduced_deltas:
            raise fail(f"{where}: {action} before an all-reduce of fragment "
                        f"{fragment[0]} of {fragment[1]}'s deltas across all replicas "
                        "has ended")
        cycle.reduced_deltas.discard(fragment)
        self.synced.setdefault(worker[1], set()).add(fragment[0])

    def _step(self, worker: Worker, action: Action, where: str) -> None:
        state = self.state[worker]
        if len(state.backward) < self.plan.microbatches:
            raise fail(f"{where}: {action} before all backwards finished")
        if state.stepped:
            raise fail(f"{where}: {action} runs a second time in one iteration")
        if self.plan.dp > 1 and not state.reduced:
            self.apart.setdefault(worker[1], action)
        state.stepped = True

    def _collective(self, gpu: str, runner: _Runner, action: Action, where: str) -> bool:
        """Join, start or await an all-reduce; False while it waits for other members."""
        worker = (runner.replica, action.stage)
        state = self.state[worker]
        subject = action.subject
        cycle = self.cycle[worker]
        if subject.reduces is Reduces.GRADIENTS and action.op is not Op.ALLREDUCE_WAIT and (
                len(state.backward) < self.plan.microbatches):
            raise fail(f"{where}: {action} before all backwards finished")
        if action.op is Op.ALLREDUCE_WAIT:
            if subject not in cycle.started:
                raise fail(f"{where}: {action} waits for an all-reduce this stage has not "
                            "started (or already waited for)")
            group, index = cycle.started[subject]
        elif runner.joined is not None:
            group, index = self.groups.key(worker, subject, gpu), runner.joined
        else:
            if subject in cycle.started:
                raise fail(f"{where}: {action} starts an all-reduce already under way")
            group = self.groups.key(worker, subject, gpu)
            index = self._join(worker, group, subject, where, action)
            runner.joined = index
            if action.op is Op.ALLREDUCE_START:
                cycle.started[subject] = (group, index)
                return True
        arrived = self.joins[group]
        if any(len(arrived.get(r, [])) <= index for r in self.groups.members(group)):
            return False
        cycle.started.pop(subject, None)
        if subject.reduces is Reduces.GRADIENTS:
            state.reduced_any = True
            state.reduced = state.reduced or self.groups.spans_all(group)
        elif self.groups.spans_all(group):
            cycle.reduced_deltas.add((subject.fragment, subject.fragments))
        return True

    def _join(self, worker: Worker, group: GroupKey, subject: Collective, where: str,
              action: Action) -> int:
        """This replica's next all-reduce in `group`: the same as every other member's
        in the same place, or a PlanError saying how they differ."""
        arrived = self.joins.setdefault(group, {})
        mine = arrived.setdefault(worker[0], [])
        index = len(mine)
        mine.append((subject, self.iteration))
        for copy in self.copies[worker[0]]:
            arrived.setdefault(copy, []).append((subject, self.iteration))
        for replica, theirs in arrived.items():
            if replica != worker[0] and len(theirs) > index and theirs[index] != mine[index]:
                other, when = theirs[index]
                peer = self.lead[(replica, worker[1])]
                raise fail(
                    f"{where}: {action} meets {peer}'s "
                    f"{Action(worker[1], Op.ALLREDUCE, None, other)} (iteration {when}): "
                    "replicas must reduce the same collective in the same iteration")
        return index

    def _report_deadlock(self) -> None:
        gpu = next(g for g in self.runners if not self._finished(g))
        runner = self.runners[gpu]
        action = self.program[gpu][runner.pc]
        worker = (runner.replica, action.stage)
        if action.op.is_collective:
            subject = action.subject
            if action.op is Op.ALLREDUCE_WAIT:
                group, index = self.cycle[worker].started[subject]
            else:
                group = self.groups.key(worker, subject, gpu)
                index = runner.joined if runner.joined is not None else 0
            arrived = self.joins.get(group, {})
            absent = [r for r in self.groups.members(group) if len(arrived.get(r, [])) <= index]
            other = self.lead[(absent[0], worker[1])]
            raise fail(
                f"deadlock: {self._where(gpu)} waits at {action} for {other}, which waits at "
                f"{self.runners[other].waiting or 'an earlier action'}"
            )
        step = -1 if action.op is Op.RECV_F else 1
        peer_gpu = self.lead[(runner.replica, action.stage + step)]
        peer_at = (self.program[peer_gpu][self.runners[peer_gpu].pc]
                   if not self._finished(peer_gpu) else "its end")
        raise fail(f"deadlock: {self._where(gpu)} waits at {action} for {peer_gpu}, which "
                   f"waits at {peer_at}")


def _copies(plan: Plan, groups: _Groups) -> dict[int, list[int]]:
    """The first replica of each class of replicas alike, with the others of its class."""
    programs = plan.all_programs()

    def signature(replica: int) -> tuple[object, ...]:
        leads = [plan.lead_gpu(replica, stage) for stage in range(plan.pp)]
        return (tuple(id(program[gpu]) for program in programs for gpu in leads),
                tuple(groups.dc_of(gpu) for gpu in leads) if groups.dc_of else ())

    first: dict[tuple[object, ...], int] = {}
    copies: dict[int, list[int]] = {}
    for replica in range(plan.dp):
        runs = first.setdefault(signature(replica), replica)
        copies.setdefault(runs, [])
        if runs != replica:
            copies[runs].append(replica)
    return copies
