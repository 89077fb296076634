"""The simulator as a backend: modeled compute, flow-level network, any scale."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from testbed.common.choices import Status
from testbed.common.codec import from_json
from testbed.common.span_table import last_end
from testbed.common.spans import Span
from testbed.errors import InputError, TestbedError
from testbed.inference.bubbles import RequestRow, inference_results, make_broker
from testbed.metrics.overruns import prefill_overruns
from testbed.metrics.summary import Summary, iteration_ends, summarize
from testbed.plan.model import Plan
from testbed.policy.base import TrainingPolicy
from testbed.policy.given import PLAN_FILE
from testbed.report.results import RunRecord
from testbed.report.run_results import Inference, RecoveryBlock, SimulatorBlock
from testbed.run.backend import BackendRun, Say
from testbed.run.checkpoint import Progress
from testbed.run.recovery import resume_from
from testbed.run.segments import Joined, RunSegment, Segment, SegmentResult, run_segments
from testbed.run.spec import RunSpec
from testbed.sim.bubble_seed import modeled_waits
from testbed.sim.simulate import simulate_plan, tokens_per_iteration, wan_capacity_bps
from testbed.sim.simulator import Simulator
from testbed.topology.net_events import event_spans


class SimulatorBackend:
    name: Literal["simulate"] = "simulate"

    def check(self, spec: RunSpec, plan: Plan, resume: Progress | None) -> None:
        """Whatever plan validated, the simulator runs: torch's whole schedule language
        (virtual stages, split backwards, overlapped units) included; a scenario's failures
        not with bubble filling (its requests are not carried across a recovery)."""
        check_recoverable(spec)

    def execute(self, spec: RunSpec, plan: Plan, policy: TrainingPolicy, directory: Path,
                say: Say, resume: Progress | None) -> BackendRun:
        if spec.scenario.failures:
            return simulate_with_failures(spec, plan, policy, say)
        return BackendRun(self.record(spec, plan, policy))

    def record(self, spec: RunSpec, plan: Plan, policy: TrainingPolicy) -> RunRecord:
        """The run in memory: the simulator writes nothing of its own."""
        if spec.scenario.failures:
            return simulate_with_failures(spec, plan, policy, lambda _m: None).record
        seed = modeled_waits(spec.topology, spec.job, plan, policy, spec.simulate.profile) \
            if spec.common.bubble_policy else {}
        broker = make_broker(spec.topology, spec.job, plan, spec.common.bubble_policy,
                             spec.common.bubble_options, seed)
        summary, spans = simulate_plan(spec.topology, spec.job, plan, policy, spec.simulate.profile,
                                       broker, spec.link_events, spec.simulate.jitter,
                                       spec.scenario.stragglers)
        end = last_end(spans)
        inference = inference_results(spec.topology, spec.job, plan, broker, end)
        if broker is not None:
            inference["overruns"] = prefill_overruns(spans).as_dict()
        return _record(spec, plan, summary, spans, typed_inference(inference), None,
                       requests=None if broker is None else broker.request_rows(end))


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


def typed_inference(block: dict[str, Any]) -> Inference:
    """results.json's `inference` block as its type (testbed.report.run_results)."""
    typed: Inference = from_json(block, Inference, "inference")
    return typed


def _record(spec: RunSpec, plan: Plan, summary: Summary, spans: Sequence[Span],
            inference: Inference, recovery: RecoveryBlock | None, status: Status = "ok",
            error: str | None = None, requests: list[RequestRow] | None = None) -> RunRecord:
    jitter = spec.simulate.jitter
    return RunRecord(
        backend="simulate", policy=spec.policy, bubble_policy=spec.common.bubble_policy,
        topology=spec.topology, job=spec.job, plan=plan, shaper=None, compute="modeled",
        summary=summary, spans=spans, start=0.0, policy_options=spec.common.policy_options,
        status=status, error=error,
        backend_block=SimulatorBlock(profile=bool(spec.simulate.profile),
                                     jitter=jitter.as_dict() if jitter else None),
        inference=inference, recovery=recovery, requests=requests)


def simulate_with_failures(spec: RunSpec, plan: Plan, policy: TrainingPolicy, say: Say
                           ) -> BackendRun:
    """The run in segments between the scenario's failures (testbed.run.segments): also the
    emulator's prediction of such a run."""
    joined = run_segments(spec, plan, policy, _segment_runner(spec, plan, policy), say)
    spans = joined_spans(spec, joined)
    summary = summarize(spans, joined.gpus, 0.0, tokens_per_iteration(spec.job, plan),
                        wan_capacity_bps(spec.topology, plan), plan.period, joined.epochs)
    end = max((s["end"] for s in spans), default=0.0)
    inference = typed_inference(inference_results(spec.topology, spec.job, plan, None, end))
    error = joined.error
    record = _record(spec, plan, summary, spans, inference, recovery_results(spec, joined),
                     "failed" if error else "ok", str(error) if error else None)
    return BackendRun(record, error)


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


def _segment_runner(spec: RunSpec, plan: Plan, policy: TrainingPolicy) -> RunSegment:
    def run(segment: Segment) -> SegmentResult:
        simulator = Simulator(
            segment.topology, spec.job, segment.plan, policy,
            spec.simulate.profile if segment.plan is plan else None, events=segment.events,
            jitter=spec.simulate.jitter, stragglers=segment.stragglers, losses=segment.losses,
            first_iteration=segment.first_iteration)
        try:
            result = simulator.run()
        except RuntimeError as exc:
            return SegmentResult([], error=TestbedError(f"simulation failed: {exc}"))
        spans = [s for s in result.spans if s["kind"] != "net_event"]
        done = segment.first_iteration + len(iteration_ends(
            spans, segment.plan.used_gpus(), first=segment.first_iteration))
        return SegmentResult(spans, result.lost, resume_from(
            done, segment.first_iteration, spec.common.checkpoint_every, segment.plan.period))

    return run
