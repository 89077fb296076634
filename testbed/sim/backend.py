"""The simulator as a backend: modeled compute, flow-level network, any scale; and as the
prediction the emulator writes beside what it measures (SimulatorPrediction)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from testbed.common.choices import Status
from testbed.common.span_table import last_end
from testbed.common.spans import Span
from testbed.errors import TestbedError
from testbed.inference.bubbles import (
    BubbleBroker,
    RequestRow,
    inference_results,
    make_broker,
)
from testbed.inference.workload import WaitKey
from testbed.job.model import Job
from testbed.metrics.lockstep import lockstep
from testbed.metrics.overruns import prefill_overruns
from testbed.metrics.summary import Summary, iteration_ends, summarize
from testbed.plan.jitter import Jitter
from testbed.plan.model import Plan
from testbed.plan.tcp_model import MSS
from testbed.plan.throughput import tokens_per_iteration, wan_capacity_bps
from testbed.policy.base import TrainingPolicy
from testbed.policy.registry import Planner
from testbed.report.results import RunRecord
from testbed.report.run_results import Inference, RecoveryBlock, SimulatorBlock, WanConnection
from testbed.run.backend import BackendRun, Say, typed_inference
from testbed.run.checkpoint import Progress
from testbed.run.recovery import resume_from
from testbed.run.segments import (
    RunSegment,
    Segment,
    SegmentResult,
    check_recoverable,
    joined_spans,
    recovery_results,
    run_segments,
)
from testbed.run.spec import RunSpec
from testbed.sim.bubble_seed import modeled_waits
from testbed.sim.pair_states import PairState
from testbed.sim.simulate import simulate_plan, simulate_run
from testbed.sim.simulator import Simulator


class SimulatorBackend:
    name: Literal["simulate"] = "simulate"

    def __init__(self, replan: Planner) -> None:
        self.replan = replan
        """What makes the policy's plan again after a failure (testbed.run.segments)."""

    def check(self, spec: RunSpec, plan: Plan, resume: Progress | None) -> None:
        """Whatever plan validated, the simulator runs: torch's whole schedule language
        (virtual stages, split backwards, overlapped units) included; a scenario's failures
        not with bubble filling (its requests are not carried across a recovery)."""
        check_recoverable(spec)

    def execute(self, spec: RunSpec, plan: Plan, policy: TrainingPolicy, directory: Path,
                say: Say, resume: Progress | None) -> BackendRun:
        if spec.scenario.failures:
            return simulate_with_failures(spec, plan, policy, say, self.replan)
        return BackendRun(self.record(spec, plan, policy))

    def record(self, spec: RunSpec, plan: Plan, policy: TrainingPolicy) -> RunRecord:
        """The run in memory: the simulator writes nothing of its own."""
        if spec.scenario.failures:
            return simulate_with_failures(spec, plan, policy, lambda _m: None,
                                          self.replan).record
        seed = modeled_waits(spec.topology, spec.job, plan, policy, spec.simulate.profile) \
            if spec.common.bubble_policy else {}
        broker = make_broker(spec.topology, spec.job, plan, spec.common.bubble_policy,
                             spec.common.bubble_options, seed)
        run = simulate_run(spec.topology, spec.job, plan, policy, spec.simulate.profile,
                           broker, spec.link_events, spec.simulate.jitter,
                           spec.scenario.stragglers)
        end = last_end(run.spans)
        inference = inference_results(spec.topology, spec.job, plan, broker, end)
        overruns = None if broker is None else prefill_overruns(run.spans).as_dict()
        return _record(spec, plan, run.summary, run.spans,
                       typed_inference(inference, overruns), None,
                       requests=None if broker is None else broker.request_rows(end),
                       connections=run.connections)


@dataclass(frozen=True)
class SimulatorPrediction:
    """The simulator's prediction of a run (testbed.run.prediction.Prediction), which the
    emulator is handed by its caller."""

    replan: Planner

    def check(self, spec: RunSpec, plan: Plan, resume: Progress | None) -> None:
        SimulatorBackend(self.replan).check(spec, plan, resume)

    def iterations(self, spec: RunSpec, job: Job, plan: Plan, policy: TrainingPolicy,
                   broker: BubbleBroker | None) -> tuple[Summary, Sequence[Span]]:
        return simulate_plan(spec.topology, job, plan, policy, spec.simulate.profile, broker,
                             spec.link_events, stragglers=spec.scenario.stragglers)

    def with_failures(self, spec: RunSpec, plan: Plan, policy: TrainingPolicy) -> Summary:
        return simulate_with_failures(spec, plan, policy, lambda _m: None,
                                      self.replan).record.summary

    def waits(self, spec: RunSpec, plan: Plan, policy: TrainingPolicy, scale: float
              ) -> dict[WaitKey, float]:
        return modeled_waits(spec.topology, spec.job, plan, policy, spec.simulate.profile,
                             scale)


def _record(spec: RunSpec, plan: Plan, summary: Summary, spans: Sequence[Span],
            inference: Inference, recovery: RecoveryBlock | None, status: Status = "ok",
            error: str | None = None, requests: list[RequestRow] | None = None,
            connections: tuple[PairState, ...] = ()) -> RunRecord:
    jitter = spec.simulate.jitter if spec.simulate.jitter is not None \
        else Jitter(seed=spec.job.seed)  # the simulator's default (testbed.sim.simulator)
    return RunRecord(
        backend="simulate", policy=spec.policy, bubble_policy=spec.common.bubble_policy,
        topology=spec.topology, job=spec.job, plan=plan, shaper=None, compute="modeled",
        summary=summary, spans=spans, start=0.0, policy_options=spec.common.policy_options,
        status=status, error=error,
        backend_block=SimulatorBlock(profile=bool(spec.simulate.profile),
                                     jitter=jitter.as_dict(),
                                     lockstep=lockstep(spans),
                                     wan_connections=wan_connections(connections)),
        inference=inference, recovery=recovery, requests=requests)


def simulate_with_failures(spec: RunSpec, plan: Plan, policy: TrainingPolicy, say: Say,
                           replan: Planner) -> BackendRun:
    """The run in segments between the scenario's failures (testbed.run.segments): also the
    emulator's prediction of such a run."""
    joined = run_segments(spec, plan, policy, _segment_runner(spec, plan, policy), say,
                          replan)
    spans = joined_spans(spec, joined)
    summary = summarize(spans, joined.gpus, 0.0, tokens_per_iteration(spec.job, plan),
                        wan_capacity_bps(spec.topology, plan), plan.period, joined.epochs)
    end = max((s["end"] for s in spans), default=0.0)
    inference = typed_inference(inference_results(spec.topology, spec.job, plan, None, end))
    error = joined.error
    record = _record(spec, plan, summary, spans, inference, recovery_results(spec, joined),
                     "failed" if error else "ok", str(error) if error else None)
    return BackendRun(record, error)


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


def wan_connections(states: tuple[PairState, ...]) -> list[WanConnection] | None:
    """The results' record of the model's WAN pairs at the end, as the emulator records its
    hosts' sockets (testbed.emulator.backend.wan_connections); None without any (a run
    inside one DC, or one that stopped before its end)."""
    if not states:
        return None
    return [{"host": s.host, "peer": s.peer, "congestion": s.congestion,
             "min_rtt_s": s.base_rtt_s, "cwnd_segments": round(s.cwnd_bytes / MSS),
             "ssthresh_segments": round(s.ssthresh_bytes / MSS)
             if math.isfinite(s.ssthresh_bytes) else None,
             "retransmitted_segments": None, "bytes_sent": None,
             "connections": s.connections} for s in states]
