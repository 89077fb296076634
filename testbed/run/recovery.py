"""Losing a worker without losing the run: what `--on-failure` decides, backend-neutral.

A run goes in segments. A segment ends when a scenario's failure takes a GPU its plan
uses: `stop` ends the run there (as a dead worker does); `restart` goes on from the last
checkpoint on the same GPUs once the lost one is back; `replan` goes on from it at once
with the policy's plan for the GPUs still alive. Either way the time lost is the work
done since that checkpoint, the time to notice the failure and the time to start again
(the scenario's `recovery`); the next segment starts that much later, on a clock (and
with events, stragglers and failures) shifted to its start. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from testbed.common.choices import OnFailure
from testbed.common.spans import Span
from testbed.errors import PlanError
from testbed.plan.model import Plan, PlanRecord
from testbed.report.run_results import FailureResult
from testbed.run.checkpoint import checkpoint_due
from testbed.scenario.scenario import Recovery, WorkerLoss
from testbed.scenario.slowdowns import Straggler
from testbed.topology.model import Datacenter, Topology
from testbed.topology.net_events import NetEvent


@dataclass(frozen=True)
class FailureRecord:
    """One failure as results.json records it (times in seconds from training's start)."""

    worker: str
    at_s: float
    action: OnFailure
    completed: int
    """Iterations complete when it happened."""
    resumed_from: int
    """The checkpoint the run went on from (iterations kept); the rest were redone."""
    checkpoint_s: float
    """When that checkpoint's iteration ended (the work after it was lost)."""
    detected_s: float
    resumed_s: float | None
    """When training went on; None when the run stopped."""
    plan_before: PlanRecord
    plan_after: PlanRecord | None
    back_s: float | None = None

    @property
    def time_lost_s(self) -> float | None:
        """From the end of the checkpointed work to going on: the work redone, noticing
        the failure and starting again."""
        return None if self.resumed_s is None else self.resumed_s - self.checkpoint_s

    def as_results(self) -> FailureResult:
        return {
            "worker": self.worker, "at_s": self.at_s, "back_s": self.back_s,
            "action": self.action, "completed": self.completed,
            "resumed_from": self.resumed_from, "checkpoint_s": self.checkpoint_s,
            "detected_s": self.detected_s, "resumed_s": self.resumed_s,
            "lost_work_s": self.at_s - self.checkpoint_s,
            "time_lost_s": self.time_lost_s,
            "plan_before": self.plan_before, "plan_after": self.plan_after,
        }


def resume_from(completed: int, first: int, every: int, period: int) -> int:
    """The last checkpoint at or before `completed` iterations: a multiple of `every`
    between cycles (testbed.run.checkpoint), never before the segment's own start
    (`first`, itself a checkpoint, or 0); with `every` 0 the run has none and starts
    over."""
    if every <= 0:
        return 0
    for done in range(completed, first, -1):
        if checkpoint_due(done, every, -1, period):
            return done
    return first


def resume_at(loss: WorkerLoss, recovery: Recovery, action: OnFailure,
              others: Sequence[WorkerLoss] = ()) -> tuple[float, float]:
    """(When the failure is noticed, when training goes on): `replan` goes on at once;
    `restart` waits for the lost GPU to be back, and for any other of the plan's GPUs
    (`others`: their failures) lost by the time it would start (refused if one never
    comes back)."""
    detected = loss.at_s + recovery.detect_s
    if action != "restart":
        return detected, detected + recovery.restart_s
    resumed, waiting = detected + recovery.restart_s, [loss]
    while waiting:
        lost = waiting.pop()
        if lost.back_s is None:
            raise PlanError(f"--on-failure restart waits for {lost.worker} to be back, and "
                            f"the scenario never brings it back (give the failure a `back` "
                            f"time, or use --on-failure replan)")
        resumed = max(resumed, lost.back_s + recovery.restart_s)
        waiting = [f for f in others if f.at_s < resumed and f != loss
                   and (f.back_s is None or f.back_s + recovery.restart_s > resumed)]
    return detected, resumed


def shift_events(events: Iterable[NetEvent], by: float) -> tuple[NetEvent, ...]:
    """Events on a clock that starts `by` seconds later: what started before goes on
    from 0 for what is left of it (in its order, so the one in force stays in force),
    what was over is gone."""
    out = []
    for event in events:
        end = None if event.for_s is None else event.at_s + event.for_s - by
        if end is not None and end <= 0:
            continue
        at = max(0.0, event.at_s - by)
        out.append(dataclasses.replace(event, at_s=at,
                                       for_s=None if end is None else end - at))
    return tuple(out)


def shift_stragglers(stragglers: Iterable[Straggler], by: float) -> tuple[Straggler, ...]:
    return tuple(s for s in (s.shifted(by) for s in stragglers) if s is not None)


def pending_losses(losses: Iterable[WorkerLoss], by: float) -> tuple[WorkerLoss, ...]:
    """Failures still to come on a clock that starts `by` seconds later: from `by` on,
    as a failure at time t takes what runs at t (`at: 0s` a worker as training starts;
    one at a segment's start is not among those its recovery already counted, which
    are lost by then: `lost_at`, `resume_at`)."""
    return tuple(loss.shifted(by) for loss in losses if loss.at_s >= by)


def lost_at(losses: Iterable[WorkerLoss], t: float) -> set[str]:
    """GPUs lost at time `t` and not back by then."""
    return {f.worker for f in losses if f.at_s <= t and (f.back_s is None or f.back_s > t)}


@dataclass(frozen=True)
class Survivors:
    """The topology without the GPUs lost, for a plan on those still alive. GPUs are
    named by their place in their DC, so the survivors of a DC are renumbered from 0:
    `names` maps each new name to the GPU it is."""

    topology: Topology
    names: dict[str, str]

    def physical(self, gpu: str) -> str:
        return self.names.get(gpu, gpu)

    def local(self, gpu: str) -> str | None:
        """The new name of a GPU, None if it is lost."""
        for new, old in self.names.items():
            if old == gpu:
                return new
        return None


def survivors(topology: Topology, lost: set[str]) -> Survivors:
    """`topology` without the GPUs in `lost`; a DC left with none is dropped with its
    links (a plan error if the others are then cut off from each other)."""
    names: dict[str, str] = {}
    kept: list[Datacenter] = []
    for dc in topology.datacenters:
        alive = [g for g in dc.host_names() if g not in lost]
        if not alive:
            continue
        kept.append(dataclasses.replace(dc, gpus=len(alive)))
        names.update({f"{dc.name}-{i}": g for i, g in enumerate(alive)})
    if not kept:
        raise PlanError("every GPU is lost: there is nothing to replan on")
    dcs = {dc.name for dc in kept}
    links = tuple(link for link in topology.links if link.a in dcs and link.b in dcs)
    reduced = dataclasses.replace(topology, datacenters=tuple(kept), links=links, events=None)
    for dc in kept[1:]:
        try:
            reduced.path(kept[0].name, dc.name)
        except KeyError:
            raise PlanError(f"without {', '.join(sorted(lost))} datacenter {dc.name} has "
                            f"no WAN path to {kept[0].name}: there is no one network left "
                            "to replan on") from None
    return Survivors(reduced, names)


def renamed_spans(spans: Iterable[Span], names: dict[str, str]) -> list[Span]:
    """Spans of a plan on the survivors with every GPU under its own name."""
    if not names or all(k == v for k, v in names.items()):
        return list(spans)
    out: list[Span] = []
    for span in spans:
        copy = span.copy()
        for key in ("gpu", "peer", "src", "dst"):
            value = copy.get(key)
            if isinstance(value, str) and value in names:
                copy[key] = names[value]
        out.append(copy)
    return out


def plan_record(plan: Plan, names: dict[str, str] | None = None) -> PlanRecord:
    """The plan as results record it, its GPUs under their own names."""
    summary = plan.summary()
    placement = summary["placement"]
    if names:
        placement = {w: [names.get(g, g) for g in gpus] for w, gpus in placement.items()}
    return {"policy": summary["policy"], "dp": summary["dp"], "pp": summary["pp"],
            "microbatches": summary["microbatches"],
            "layers_per_stage": summary["layers_per_stage"], "placement": placement}


def failure_span(record: FailureRecord, end: float) -> Span:
    """The failure on the lost GPU's track: from its loss to training going on."""
    what = ("the run stopped" if record.resumed_s is None else
            f"{record.action} from iteration {record.resumed_from}")
    return {"gpu": record.worker, "kind": "failure", "start": record.at_s,
            "end": end if record.resumed_s is None else record.resumed_s, "iteration": -1,
            "detail": f"{record.worker} lost at {record.at_s:g} s; {what}"}


def kept_spans(spans: Sequence[Span], before: int) -> list[Span]:
    """What a run keeps of its spans when it goes back to the checkpoint after `before`
    iterations: those iterations' work, and failures (`iteration` -1)."""
    return [s for s in spans if s["iteration"] < before and
            (s["iteration"] >= 0 or s["kind"] == "failure")]


