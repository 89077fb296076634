"""Discrete-event simulation of a Plan: the same interpreted action lists, arbiter and
policy hooks as the emulator, with modeled compute and a flow-level network. Writes the
same spans, so metrics and reports cannot tell the backends apart.

A worker is a GPU (a tensor-parallel group) of one replica and runs its list in order,
whatever stages it holds: each compute costs its own stage's time (a split backward's I
and W their halves of it, an overlapped unit its parts one after the other), a message
between two of its stages is handed over at once, and each stage reduces its own
gradients with its replicas."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from testbed.common.span_table import SpanTable
from testbed.inference.bubbles import BubbleBroker
from testbed.job.model import Job
from testbed.metrics.summary import median_at_least, slower_after
from testbed.plan.collective import Collective
from testbed.plan.compute import stage_costs
from testbed.plan.host_tcp import hosts_as_planned
from testbed.plan.interpret import (
    AllReduce,
    Compute,
    MessageTag,
    OptimizerStep,
    OuterStep,
    Overlapped,
    Part,
    Phase,
    Prefill,
    Receive,
    ReduceStart,
    ReduceWait,
    Send,
    SendWait,
    Step,
)
from testbed.plan.jitter import Jitter, Noise
from testbed.plan.model import Plan
from testbed.policy.arbiter import Arbiter
from testbed.policy.base import TrainingPolicy
from testbed.scenario.scenario import WorkerLoss
from testbed.scenario.slowdowns import Straggler, factor_at, slowdowns_for
from testbed.sim.agenda import Agenda
from testbed.sim.links import Links, capacities, queues
from testbed.sim.lost import first_loss, spans_before
from testbed.sim.network import FluidNetwork
from testbed.sim.prefills import Prefills
from testbed.sim.rings import AllReduces
from testbed.sim.transfers import Transfers
from testbed.sim.workers import SendKey, SimWorker, interpreted
from testbed.topology.model import Topology
from testbed.topology.net_events import NetEvent, changes, event_spans


@dataclass
class SimResult:
    spans: SpanTable
    start: float
    stopped_at: float | None = None
    """Set when the run stopped early, once its median iteration was sure to exceed
    `stop_above`: when; the spans are those recorded until then."""
    median_at_least: float | None = None
    """With `stopped_at`: what the median measured iteration was sure to exceed."""
    events: int = 0
    """Callbacks the run went through (what its wall time follows)."""
    lost: WorkerLoss | None = None
    """The scenario's failure that ended the run at its time, if one did."""


class Simulator:
    def __init__(
        self,
        topology: Topology,
        job: Job,
        plan: Plan,
        policy: TrainingPolicy,
        profile: Mapping[int, Mapping[str, float]] | None = None,
        step_s: float = 0.0,
        bubbles: BubbleBroker | None = None,
        events: Sequence[NetEvent] = (),
        jitter: Jitter | None = None,
        stop_above: float | None = None,
        stragglers: Sequence[Straggler] = (),
        losses: Sequence[WorkerLoss] = (),
        first_iteration: int = 0,
        spans: SpanTable | None = None,
    ) -> None:
        """`stop_above`: seconds; the run stops as soon as its median measured iteration
        must be longer (a planner needs no more of a candidate slower than its best).
        Ignored for a plan whose iterations differ (period > 1): the median of unlike
        iterations says nothing of the run (its syncs are a few long ones), so such a
        plan runs to its end and is judged over whole cycles (testbed.metrics.summary).
        `stragglers`: slower compute; `losses`: the first to take a GPU of the plan ends the
        run (testbed.sim.lost); `first_iteration`: where a run from a checkpoint starts."""
        topology = hosts_as_planned(topology, plan)
        self.topology, self.job, self.plan, self.policy = topology, job, plan, policy
        self.net_events = tuple(events)
        self.bubbles = bubbles
        self.costs = stage_costs(topology, job, plan, profile)
        self.step_s = step_s
        self.jitter = jitter if jitter is not None else Jitter(seed=job.seed)
        self.noise = Noise(self.jitter)
        self.agenda = Agenda(lambda: not all(w.done for w in self.gpu_workers))
        self.spans = SpanTable() if spans is None else spans  # a planner's keeps some only
        self.workers: dict[tuple[int, int], SimWorker] = {}
        """By (replica, stage): a GPU holding several stages is there under each."""
        self.gpu_workers: list[SimWorker] = []
        """Each worker once."""
        held: dict[tuple[int, tuple[str, ...]], list[int]] = {}
        for (replica, stage), gpus in plan.workers():
            held.setdefault((replica, gpus), []).append(stage)
        steps: dict[tuple[int, tuple[int, ...]], tuple[Step, ...]] = {}  # replicas share lists
        for index, ((replica, gpus), stages) in enumerate(held.items()):
            programs = tuple(interpreted(steps, program[gpus[0]], tuple(stages), plan.pp)
                             for program in plan.all_programs())
            dc = topology.dc_of(gpus[0])
            worker = SimWorker(index, replica, stages[0], gpus, dc, programs, plan.program_of,
                               stages=tuple(stages), iteration=first_iteration,
                               slowdowns=slowdowns_for(stragglers, gpus, dc))
            self.gpu_workers.append(worker)
            for stage in stages:
                self.workers[(replica, stage)] = worker
        self.steps_per_iteration = sum(
            isinstance(step, OptimizerStep) for w in self.gpu_workers for step in w.programs[0])
        """Optimizer steps all workers take in an iteration (one per stage)."""
        self.network = FluidNetwork(capacities(topology, self.gpu_workers), self.agenda.at,
                                    queues=queues(topology))
        self.links = Links(topology, self.network, self.agenda.at)
        self.transfers = Transfers(topology, plan, self.network, self.links,
                                   Arbiter(policy, plan), self.spans, self.noise)
        self.allreduces = AllReduces(topology, job, plan, self.workers, self.transfers,
                                     self.agenda.at, self.spans)
        self.prefills = None if bubbles is None or job.inference is None else Prefills(
            topology, job.inference, bubbles, self.network, self.links, self.agenda.at,
            self.spans, self.noise)
        self.stop_above = stop_above if plan.period == 1 else None
        self.iteration_ends: list[float] = []
        """When every worker had finished each iteration's step, so far."""
        self._steps: dict[int, tuple[int, float]] = {}
        """Per iteration under way: workers past their step, and the last step's end."""
        self.mailbox: set[MessageTag] = set()
        """Messages that arrived before their receive."""
        self.waiting: dict[MessageTag, SimWorker] = {}
        """Receives waiting for their message."""
        for change in changes(self.net_events, topology):
            self.agenda.at(change.at_s, functools.partial(self.links.apply, change))
        self.lost = first_loss(losses, plan.used_gpus())
        if self.lost is not None:
            self.agenda.stop_after = self.lost.at_s

    def run(self) -> SimResult:
        for worker in self.gpu_workers:
            self.agenda.at(0.0, functools.partial(self._advance, worker))
        self._watch()
        events = self.agenda.run()
        if self.lost is not None and self.agenda.now > self.lost.at_s:
            return SimResult(spans_before(self.spans, self.lost.at_s, self.net_events), 0.0,
                             self.lost.at_s, events=events, lost=self.lost)
        if self.agenda.now > self.agenda.stop_after:
            bound = median_at_least(0.0, self.iteration_ends, self.job.iterations,
                                    self.agenda.now)
            return SimResult(self.spans, 0.0, self.agenda.now, bound, events)
        stuck = [w.lead for w in self.gpu_workers if not w.done]
        if stuck:
            raise RuntimeError(f"simulation stalled with {', '.join(stuck[:4])} unfinished")
        self.spans.extend(event_spans(self.net_events, 0.0, self.spans.last_end()))
        return SimResult(self.spans, 0.0, events=events)

    def _stepped(self, iteration: int, end: float) -> None:
        if self.stop_above is None:
            return  # only a run that may stop early watches its iterations end
        done, last = self._steps.get(iteration, (0, 0.0))
        done, last = done + 1, max(last, end)
        self._steps[iteration] = (done, last)
        if done == self.steps_per_iteration and iteration == len(self.iteration_ends):
            del self._steps[iteration]
            self.iteration_ends.append(last)
            self._watch()

    def _watch(self) -> None:
        """Stop at the earliest time the median iteration shows longer than `stop_above`."""
        if self.stop_above is not None:
            self.agenda.stop_after = min(
                slower_after(0.0, self.iteration_ends, self.job.iterations, self.stop_above),
                float("inf") if self.lost is None else self.lost.at_s)

    def compute_s(self, compute: Compute) -> float:
        """How long one forward, backward or part of a backward holds the worker's GPU."""
        cost = self.costs[compute.stage]
        if compute.phase is Phase.FORWARD:
            modeled = cost.forward_s
        elif compute.part is Part.INPUT:
            modeled = cost.input_s
        elif compute.part is Part.WEIGHT:
            modeled = cost.weight_s
        else:
            modeled = cost.backward_s
        return modeled * self.noise.factor("compute")

    def _compute(self, worker: SimWorker, computes: tuple[Compute, ...], now: float) -> None:
        """Hold the GPU for the computes one after the other (an overlapped unit's parts
        as torch's runtime runs them), join the all-reduces that start in their backward
        as it has their values, then go on."""
        end = now
        timed = []
        for compute in computes:
            start, end = end, end + self.compute_s(compute) * factor_at(worker.slowdowns, end)
            timed.append((compute, start, end))
            if compute.part is Part.WHOLE:
                worker.record(self.spans, compute.phase.label, start, end, compute.microbatch,
                              stage=compute.stage)
            else:
                worker.record(self.spans, "backward", start, end, compute.microbatch,
                              stage=compute.stage,
                              part="I" if compute.part is Part.INPUT else "W")
        self.allreduces.in_backward(worker, timed)
        worker.pc += 1
        self.agenda.at(end, functools.partial(self._advance, worker))

    def _advance(self, worker: SimWorker, now: float) -> None:
        """Run the worker's steps from where it is until one takes time or waits."""
        steps = worker.steps
        while True:
            if worker.pc == len(steps):
                worker.begin(worker.iteration + 1)
                if worker.iteration == self.job.iterations:
                    worker.done = True
                    return
                steps = worker.steps
            if not self._run(worker, steps[worker.pc], now):
                return

    def _run(self, worker: SimWorker, step: Step, now: float) -> bool:
        """Run one step: True when the worker goes straight on to the next, False when
        this one takes time or waits (the agenda or an arrival resumes it)."""
        match step:
            case Compute():
                self._compute(worker, (step,), now)
                return False
            case Overlapped(parts=parts):
                self._compute(worker, parts, now)
                return False
            case OptimizerStep(stage=stage):
                worker.record(self.spans, "step", now, now + self.step_s, stage=stage)
                self._stepped(worker.iteration, now + self.step_s)
                return self._held_for_a_step(worker, now)
            case Send():
                self._send(worker, step, now)
                return True
            case SendWait():
                return self._send_wait(worker, step, now)
            case Receive():
                return self._receive(worker, step, now)
            case AllReduce(collective=collective, stage=stage):
                return self._allreduce(worker, collective, stage, now)
            case ReduceStart(collective=collective, stage=stage):
                if not worker.early.pop((worker.iteration, worker.pc), False):
                    worker.under_way[(stage, collective)] = self.allreduces.join(
                        worker, stage, collective, now, None, None)
                worker.pc += 1
                return True
            case ReduceWait(collective=collective, stage=stage):
                return self._reduce_wait(worker, collective, stage, now)
            case OuterStep(collective=collective, stage=stage):
                worker.record(self.spans, "outer_step", now, now + self.step_s,
                              collective=str(collective), stage=stage)
                return self._held_for_a_step(worker, now)
            case Prefill():
                worker.pc += 1  # nothing runs there (see testbed.plan.interpret)
                return True
            case _:
                raise RuntimeError(f"{worker.lead}: the simulator cannot run {step!r}")

    def _held_for_a_step(self, worker: SimWorker, now: float) -> bool:
        """An (outer) optimizer step holds the worker `step_s`: on at once if that is 0."""
        worker.pc += 1
        if self.step_s:
            self.agenda.at(now + self.step_s, functools.partial(self._advance, worker))
            return False
        return True

    def _send(self, worker: SimWorker, send: Send, now: float) -> None:
        """Start a pipeline message on its way; the worker goes on."""
        tag = send.tag(worker.iteration, worker.replica)
        worker.pc += 1
        if send.local:  # handed over in the GPU's memory: nothing moves
            self._deliver(tag, now)
            return
        peer = self.workers[(worker.replica, send.to_stage)]
        arrival = functools.partial(self._deliver, tag)
        if worker.waits_for_sends:
            arrival = functools.partial(
                self._deliver_and_ack, tag, worker,
                (worker.iteration, send.phase, send.to_stage, send.microbatch),
                self.transfers.path(worker, peer)[1])
        self.transfers.send(now, worker, peer, self.job.activation_bytes,
                            arrival, send.op, send.microbatch, worker.iteration,
                            send.stage, send.to_stage)

    def _send_wait(self, worker: SimWorker, wait: SendWait, now: float) -> bool:
        key = (worker.iteration, wait.phase, wait.to_stage, wait.microbatch)
        if wait.local or key in worker.completed_sends:
            worker.completed_sends.discard(key)
            worker.record(self.spans, "wait_send", now, now, wait.microbatch,
                          peer=self._lead(worker.replica, wait.to_stage),
                          stage=_sender(wait.phase, wait.to_stage))
            worker.pc += 1
            return True
        worker.awaiting_send = key
        worker.waiting_since = now
        return False

    def _receive(self, worker: SimWorker, receive: Receive, now: float) -> bool:
        tag = receive.tag(worker.iteration, worker.replica)
        if tag in self.mailbox:
            self.mailbox.discard(tag)
            worker.record(self.spans, "recv", now, now, receive.microbatch,
                          action=worker.pc, stage=receive.stage)
            worker.pc += 1
            return True
        self.waiting[tag] = worker
        worker.waiting_since = now
        if self.prefills is not None:
            self.prefills.fill(worker, now, self._advance)
        return False

    def _allreduce(self, worker: SimWorker, collective: Collective, stage: int,
                   now: float) -> bool:
        worker.waiting_since = now
        joined = self.allreduces.join(worker, stage, collective, now, worker.pc,
                                      self._after_allreduce)
        if joined.done:  # a group of one
            worker.pc += 1
            return True
        if self.prefills is not None:
            self.prefills.fill(worker, now, self._advance)
        return False

    def _reduce_wait(self, worker: SimWorker, collective: Collective, stage: int,
                     now: float) -> bool:
        if (stage, collective) not in worker.under_way:
            raise RuntimeError(f"{worker.lead} waits for all-reduce [{collective}] "
                               f"of stage {stage}, which it has not started")
        joined = worker.under_way.pop((stage, collective))
        if joined.done:
            worker.record(self.spans, "wait_reduce", now, now, action=worker.pc,
                          collective=str(collective), stage=stage)
            worker.pc += 1
            return True
        worker.waiting_since = now
        joined.resume = functools.partial(self._after_reduce_wait, collective, stage)
        if self.prefills is not None:
            self.prefills.fill(worker, now, self._advance)
        return False

    def _deliver_and_ack(self, tag: MessageTag, sender: SimWorker, key: SendKey,
                         latency: float, now: float) -> None:
        """The message is there; its sender learns so when the receiving host's
        acknowledgement of the last byte comes back, one path latency later."""
        self._deliver(tag, now)
        self.agenda.at(now + latency, functools.partial(self._send_completed, sender, key))

    def _send_completed(self, worker: SimWorker, key: SendKey, now: float) -> None:
        if worker.awaiting_send != key:
            worker.completed_sends.add(key)
            return
        worker.awaiting_send = None
        _, phase, to_stage, microbatch = key
        worker.record(self.spans, "wait_send", worker.waiting_since, now, microbatch,
                      peer=self._lead(worker.replica, to_stage),
                      stage=_sender(phase, to_stage))
        worker.pc += 1
        self._advance(worker, now)

    def _after_allreduce(self, worker: SimWorker, now: float) -> None:
        """The all-reduce is done (and the step index past it): a measured bubble, and the
        worker goes on unless a prefill still holds its GPU."""
        if self.bubbles is not None:
            self.bubbles.record_wait(worker.lead, worker.pc - 1, worker.iteration,
                                     now - worker.waiting_since)
        if worker.prefill_until > now:
            worker.resume_after_prefill = True
            return
        self._advance(worker, now)

    def _after_reduce_wait(self, collective: Collective, stage: int, worker: SimWorker,
                           now: float) -> None:
        """The all-reduce it waited for is done: the time it was blocked, then as after an
        all-reduce."""
        worker.record(self.spans, "wait_reduce", worker.waiting_since, now,
                      action=worker.pc - 1, collective=str(collective), stage=stage)
        self._after_allreduce(worker, now)

    def _lead(self, replica: int, stage: int) -> str:
        return self.workers[(replica, stage)].lead

    def _deliver(self, tag: MessageTag, now: float) -> None:
        worker = self.waiting.pop(tag, None)
        if worker is None:
            self.mailbox.add(tag)
            return
        worker.record(self.spans, "recv", worker.waiting_since, now, tag.microbatch,
                      action=worker.pc, waited=now - worker.waiting_since, stage=tag.stage)
        if self.bubbles is not None:
            self.bubbles.record_wait(
                worker.lead, worker.pc, worker.iteration, now - worker.waiting_since
            )
        worker.pc += 1
        if worker.prefill_until > now:  # the GPU is still busy with a prefill
            worker.resume_after_prefill = True
            return
        self._advance(worker, now)


def _sender(phase: Phase, to_stage: int) -> int:
    """The stage that sent a pipeline message: activations go down the pipeline, input
    gradients back up."""
    return to_stage - 1 if phase is Phase.FORWARD else to_stage + 1

