"""A run in segments, by either backend: each segment runs the plan until the scenario's
next failure takes one of its GPUs, and `--on-failure` decides what follows
(testbed.run.recovery). A backend gives one function, which runs one segment; this module
shifts the scenario to each segment's start, plans again where asked (with the planner
the backend is handed: this module imports no simulator), and joins the segments into one
run on one clock (seconds from the start of training); and what both backends refuse of
such a run (check_recoverable) and record of it (joined_spans, recovery_results)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from testbed.common.spans import Span
from testbed.common.units import plural
from testbed.errors import InputError, TestbedError
from testbed.job.model import Job
from testbed.metrics.summary import Epoch, iteration_ends
from testbed.plan.model import Plan
from testbed.plan.throughput import tokens_per_iteration
from testbed.policy.base import TrainingPolicy
from testbed.policy.given import PLAN_FILE
from testbed.policy.registry import Planner
from testbed.report.run_results import RecoveryBlock
from testbed.run.backend import Say
from testbed.run.checkpoint import shifted
from testbed.run.recovery import (
    FailureRecord,
    Survivors,
    failure_span,
    kept_spans,
    lost_at,
    pending_losses,
    plan_record,
    renamed_spans,
    resume_at,
    shift_events,
    shift_stragglers,
    survivors,
)
from testbed.run.spec import RunSpec
from testbed.scenario.scenario import WorkerLoss
from testbed.scenario.slowdowns import Straggler
from testbed.topology.model import Topology
from testbed.topology.net_events import NetEvent, event_spans


@dataclass(frozen=True)
class Segment:
    """What one segment runs: times count from its own start, GPUs by the segment's
    topology's names."""

    index: int
    topology: Topology
    plan: Plan
    first_iteration: int
    """Iterations before it are done (a checkpoint, or 0)."""
    events: tuple[NetEvent, ...]
    stragglers: tuple[Straggler, ...]
    losses: tuple[WorkerLoss, ...]
    restore: tuple[Plan, dict[str, str]] | None = None
    """Where it goes on with another plan (replanned): the plan whose checkpoint it goes
    on from, and that plan's GPU names (testbed.run.recovery.Survivors.names)."""


@dataclass
class SegmentResult:
    spans: list[Span]
    """On the segment's clock (0 at its start of training), events' spans left out."""
    lost: WorkerLoss | None = None
    """The failure that ended it (segment time and names)."""
    checkpoint: int = 0
    """The newest complete checkpoint when it ended (iterations done)."""
    losses: dict[int, float] = field(default_factory=dict)
    error: TestbedError | None = None
    """A failure that is not the scenario's ends the run (whatever --on-failure says)."""
    synced_losses: dict[int, float] = field(default_factory=dict)
    """The synchronized model's loss by iteration, from a segment that ran to its end
    (it evaluates every model kept since the run began, checkpointed ones too)."""


RunSegment = Callable[[Segment], SegmentResult]


@dataclass
class Joined:
    """The segments as one run."""

    spans: list[Span]
    losses: dict[int, float]
    epochs: list[Epoch]
    failures: list[FailureRecord]
    gpus: list[str]
    """Every GPU some segment used (what utilization is over)."""
    error: TestbedError | None = None
    synced_losses: dict[int, float] = field(default_factory=dict)


def run_segments(spec: RunSpec, plan: Plan, policy: TrainingPolicy, run: RunSegment,
                 say: Say, replan: Planner) -> Joined:
    """Segments until one ends without a failure of the scenario's, or `stop` (or a
    failure that cannot be recovered from) ends the run; `replan`: what makes the
    policy's plan again for `--on-failure replan` (the caller's, with the simulator)."""
    scenario, action = spec.scenario, spec.common.on_failure
    t0, first, history, losses = 0.0, 0, [], {}
    place = Survivors(spec.topology, {})
    epochs = [Epoch(0, tuple(plan.used_gpus()), tokens_per_iteration(spec.job, plan))]
    failures: list[FailureRecord] = []
    restore: tuple[Plan, dict[str, str]] | None = None
    for index in range(len(scenario.failures) + 1):
        segment = Segment(index, place.topology, plan, first,
                          _events_on(place.topology, shift_events(spec.link_events, t0)),
                          _stragglers_on(place, shift_stragglers(scenario.stragglers, t0)),
                          _losses_on(place, pending_losses(scenario.failures, t0)), restore)
        result = run(segment)
        history += renamed_spans(shifted(result.spans, t0), place.names)
        losses.update(result.losses)
        if result.error is not None or result.lost is None:
            return Joined(history, losses, epochs, failures, _all_gpus(epochs), result.error,
                          result.synced_losses)
        loss = WorkerLoss(result.lost.at_s + t0, place.physical(result.lost.worker),
                          None if result.lost.back_s is None else result.lost.back_s + t0)
        completed = len(iteration_ends(history, (), epochs))
        checkpoint = max(first, result.checkpoint) if spec.common.checkpoint_every else 0
        checkpoint_s = t0 if checkpoint == first else _end_of(history, epochs, checkpoint)
        who, before = _describe(plan, place, result.lost.worker), plan_record(plan, place.names)
        stopped = FailureRecord(loss.worker, loss.at_s, action, completed, checkpoint,
                                checkpoint_s, loss.at_s, None, before, None, loss.back_s)
        try:
            in_use = {place.physical(g) for g in plan.used_gpus()}
            detected, resumed = resume_at(loss, scenario.recovery, action, [
                f for f in scenario.failures if f.worker in in_use and f.at_s > loss.at_s])
            if action == "stop":
                raise TestbedError(f"worker {who} lost at {loss.at_s:g} s (scenario failure; "
                                   "--on-failure stop)")
            restore = None
            if action == "replan":
                gone = lost_at(scenario.failures, resumed)
                restore, place = (plan, place.names), survivors(spec.topology, gone)
                gpus = plural(place.topology.total_gpus, "GPU")
                say(f"replanning on the {gpus} left (without {', '.join(sorted(gone))})"
                    if gone else f"replanning on all {gpus} (every one lost is back)")
                plan = replan(policy, place.topology, _replanned(spec.job))
        except TestbedError as exc:
            failures.append(stopped)
            history.append(failure_span(stopped, loss.at_s))
            return Joined(history, losses, epochs, failures, _all_gpus(epochs), exc)
        failures.append(dataclasses.replace(stopped, detected_s=detected, resumed_s=resumed,
                                            plan_after=plan_record(plan, place.names)))
        say(f"{who} lost at {loss.at_s:g} s: {action} from iteration {checkpoint} at "
            f"{resumed:g} s ({resumed - checkpoint_s:.3g} s lost)")
        history = [*kept_spans(history, checkpoint), failure_span(failures[-1], resumed)]
        losses = {i: v for i, v in losses.items() if i < checkpoint}
        epochs = [e for e in epochs if e.first < checkpoint] + [Epoch(
            checkpoint, tuple(place.physical(g) for g in plan.used_gpus()),
            tokens_per_iteration(spec.job, plan))]
        t0, first = resumed, checkpoint
    raise AssertionError("more segments than failures")


def check_recoverable(spec: RunSpec) -> None:
    """What a run with a scenario's failures cannot do, refused before it starts."""
    scenario = spec.scenario
    if scenario.failures and spec.common.bubble_policy:
        raise InputError("a scenario with failures cannot be run with bubble filling "
                         "(its inference requests are not carried across a recovery)",
                         scenario.source)
    if scenario.failures and spec.common.on_failure == "replan" and spec.policy == PLAN_FILE:
        raise InputError(f"replan asks the run's policy for a new plan, and {PLAN_FILE} (the "
                         "given plan's) makes none: name one with -p, or use --on-failure "
                         "restart", "--on-failure")
    never = [f.worker for f in scenario.failures if f.back_s is None]
    if spec.common.on_failure == "restart" and never:
        raise InputError(f"--on-failure restart waits for a lost GPU to be back, and "
                         f"{never[0]} never is: give its failure a `back` time, or use "
                         "--on-failure replan", scenario.source, "failures")


def joined_spans(spec: RunSpec, joined: Joined) -> list[Span]:
    """The run's spans with the events' over its whole length (segments leave theirs
    out: their events are shifted to their own clocks)."""
    end = max((s["end"] for s in joined.spans), default=0.0)
    return joined.spans + event_spans(spec.link_events, 0.0, end)


def recovery_results(spec: RunSpec, joined: Joined) -> RecoveryBlock:
    """results.json's record of the failures: each one, and the time they cost."""
    lost = [f.time_lost_s for f in joined.failures if f.time_lost_s is not None]
    return RecoveryBlock(spec.common.on_failure, [f.as_results() for f in joined.failures],
                         sum(lost))


def _replanned(job: Job) -> Job:
    """The job a replan asks for: the policy chooses the degrees again for the GPUs left
    (a job's fixed dp and pp were for all of them)."""
    return dataclasses.replace(job, dp=None, pp=None)


def _describe(plan: Plan, place: Survivors, gpu: str) -> str:
    """The GPU with what it runs: its replica and every stage it holds."""
    try:
        replica, _ = plan.worker_of(gpu)
    except KeyError:
        return place.physical(gpu)
    stages = plan.stages_of(gpu)
    held = f"stage {stages[0]}" if len(stages) == 1 else \
        f"stages {', '.join(str(s) for s in stages)}"
    return f"{place.physical(gpu)} (replica {replica}, {held})"


def _end_of(spans: list[Span], epochs: list[Epoch], done: int) -> float:
    """When iteration `done` - 1 ended: where a checkpoint after `done` was taken."""
    ends = iteration_ends(spans, (), epochs)
    return ends[done - 1] if 0 < done <= len(ends) else 0.0


def _all_gpus(epochs: list[Epoch]) -> list[str]:
    return list(dict.fromkeys(g for e in epochs for g in e.gpus))


def _events_on(topology: Topology, events: tuple[NetEvent, ...]) -> tuple[NetEvent, ...]:
    """Events on links the segment's network has (a replan may drop a DC)."""
    return tuple(e for e in events if topology.has_link(e.a, e.b))


def _stragglers_on(place: Survivors, stragglers: tuple[Straggler, ...]
                   ) -> tuple[Straggler, ...]:
    out = []
    for s in stragglers:
        if s.gpu is not None:
            local = place.local(s.gpu) if place.names else s.gpu
            if local is not None:
                out.append(dataclasses.replace(s, gpu=local))
        elif any(dc.name == s.dc for dc in place.topology.datacenters):
            out.append(s)
    return tuple(out)


def _losses_on(place: Survivors, losses: tuple[WorkerLoss, ...]) -> tuple[WorkerLoss, ...]:
    out = []
    for loss in losses:
        local = place.local(loss.worker) if place.names else loss.worker
        if local is not None:
            out.append(dataclasses.replace(loss, worker=local))
    return tuple(out)
