"""The emulator as a backend: the plan run by real processes over the emulated WAN, with
the simulator's prediction beside it and time dilation where the links exceed what this
machine can forward."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from testbed.common.choices import EmulatedCompute
from testbed.common.spans import Span
from testbed.common.units import human_bytes
from testbed.emulator.backend_segments import Segments, segment_runner
from testbed.emulator.resume import check_checkpointable, checkpoints_for, save_settings
from testbed.emulator.runtime.coordinator.coordinator import Coordinator, Interrupted
from testbed.emulator.runtime.coordinator.health import Health, busy_now
from testbed.emulator.runtime.coordinator.hosts import WanSocket
from testbed.emulator.runtime.coordinator.memory import (
    MemoryPlan,
    MemoryUse,
    coordinator_now,
    predict_memory,
)
from testbed.emulator.runtime.coordinator.preflight import check_emulable, choose_compute
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.emulator.runtime.coordinator.signals import run_to_the_end
from testbed.errors import InputError, TestbedError
from testbed.inference.bubbles import inference_results, make_broker
from testbed.metrics.overruns import prefill_overruns
from testbed.metrics.summary import summarize
from testbed.plan.host_limits import available_memory
from testbed.plan.model import Plan
from testbed.plan.throughput import tokens_per_iteration, wan_capacity_bps
from testbed.policy.base import TrainingPolicy
from testbed.policy.registry import Planner
from testbed.report.results import RunRecord
from testbed.report.run_results import (
    EmulationHealth,
    EmulatorBlock,
    MeasuredMemory,
    PredictedMemory,
    WanConnection,
)
from testbed.run.backend import BackendRun, Say, typed_inference
from testbed.run.checkpoint import Progress
from testbed.run.dilation import (
    PATH_LIMIT,
    MachineLoad,
    busiest_spans_per_second,
    choose_for,
    peak_rate_bps,
    represented_inference,
    represented_requests,
    represented_spans,
    spans_per_second,
    usable_share,
)
from testbed.run.prediction import Prediction
from testbed.run.segments import check_recoverable, joined_spans, recovery_results, run_segments
from testbed.run.spec import RunSpec
from testbed.topology.seats import describe_run

PREDICTED_ITERATIONS = 20
"""Iterations the simulator runs to predict an emulated run's iteration time (and peak
rate): enough for the steady state, few enough that a run of a million iterations does
not wait for its prediction."""


class EmulatorBackend:
    name: Literal["emulate"] = "emulate"

    def __init__(self, prediction: Prediction, replan: Planner) -> None:
        self.prediction = prediction
        """The simulator's, from the caller: the emulator never imports the simulator."""
        self.replan = replan
        """What makes the policy's plan again after a failure (testbed.run.segments)."""

    def check(self, spec: RunSpec, plan: Plan, resume: Progress | None) -> None:
        """What the emulator does not run is refused before anything starts (torch's
        whole schedule language it runs: virtual stages, split backwards, overlapped
        units)."""
        if spec.simulate.jitter:
            raise InputError("applies to the simulator: an emulated run has its own noise",
                             "--jitter")
        check_emulable(spec, plan)
        check_recoverable(spec)
        if spec.common.checkpoint_every or resume:
            check_checkpointable(spec, plan)
        if spec.emulate.cluster is not None:
            check_across_machines(spec, resume)

    def execute(self, spec: RunSpec, plan: Plan, policy: TrainingPolicy, directory: Path,
                say: Say, resume: Progress | None) -> BackendRun:
        return _emulate(spec, plan, policy, directory, say, resume, self.prediction,
                        self.replan)


def check_across_machines(spec: RunSpec, resume: Progress | None) -> None:
    """What a run across machines does not do yet, refused before anything starts."""
    if spec.common.checkpoint_every or resume is not None:
        raise InputError("checkpoints and --resume are for runs on one machine", "--cluster")
    if spec.scenario.failures:
        raise InputError("a scenario's failures are for runs on one machine", "--cluster")


def _emulate(spec: RunSpec, plan: Plan, chosen: TrainingPolicy, directory: Path, say: Say,
             resume: Progress | None, prediction: Prediction, replan: Planner) -> BackendRun:
    """The run: its prediction and dilation, then the coordinator's network and workers
    (or segments between a scenario's failures), its measurements in represented time."""
    common = spec.common
    mode = choose_compute(spec.emulate.compute, len(plan.used_gpus()))
    broker = make_broker(spec.topology, spec.job, plan, common.bubble_policy,
                         common.bubble_options)
    simulable = False
    try:
        prediction.check(spec, plan, resume)  # what it does not run, it cannot predict
        simulable = True
        preview = replace(spec.job, iterations=min(
            spec.job.iterations, max(PREDICTED_ITERATIONS, plan.period)))
        simulated, predicted_spans = prediction.iterations(spec, preview, plan, chosen, broker)
        predicted = simulated.typical_s
    except TestbedError as exc:  # the emulator can still run the plan
        say(f"warning: no prediction for this run: {exc}")
        predicted, predicted_spans = None, []
    memory = predict_memory(spec.topology, spec.job, plan, mode, coordinator_now())
    k = _choose_dilation(spec, predicted_spans, mode, plan, memory, say)
    if predicted is not None:
        wall = predicted * (spec.job.iterations + 1) * k
        say(f"the simulator predicts {predicted:.3f} s per iteration; at dilation "
            f"{k} training takes about {_wall_time(wall)} of wall time")
        if spec.emulate.wall_budget_s is not None and wall > spec.emulate.wall_budget_s:
            raise TestbedError(
                f"not run: at dilation {k} it would take about {_wall_time(wall)} of wall "
                f"time ({predicted:.3g} s per iteration predicted), over the "
                f"{_wall_time(spec.emulate.wall_budget_s)} budget")
    if common.checkpoint_every and resume is None:
        save_settings(directory, spec, mode, k)
    if spec.scenario.failures:
        return _in_segments(spec, plan, chosen, directory, say, mode, k, predicted, memory,
                            prediction, replan)
    checkpoints = None
    if common.checkpoint_every or resume:
        checkpoints = checkpoints_for(directory, common.checkpoint_every,
                                      len(plan.used_gpus()), resume)
    from testbed.emulator.runtime.coordinator.capacity import worker_costs

    config = RunConfig.for_spec(
        spec, spec.topology, plan, chosen, mode, directory / "logs", k, spec.link_events,
        spec.scenario, checkpoints=checkpoints,
        bubble_seed=prediction.waits(spec, plan, chosen, k)
        if common.bubble_policy and simulable else {}, action_cpu_s=worker_costs(say).span_cpu_s)
    coordinator = Coordinator(config, say=say)
    outcome, error = run_to_the_end(coordinator)
    if outcome is None:
        raise error or TestbedError("the run ended before it started")
    spans = represented_spans(outcome.spans, outcome.start, k)
    summary = outcome.summary if k == 1 else summarize(
        spans, plan.used_gpus(), outcome.start, tokens_per_iteration(spec.job, plan),
        wan_capacity_bps(spec.topology, plan), plan.period)
    # what the run needed to keep the represented pace sets the next dilation
    health = None if outcome.health is None else \
        outcome.health.behind(summary.typical_s, predicted)
    if health is not None and health.warning():
        say(f"warning: {health.warning()}")
    until = max((s["end"] for s in outcome.spans), default=outcome.start) - outcome.start
    inference = inference_results(coordinator.topology, coordinator.job, plan,
                                  coordinator.broker, until)
    record = RunRecord(
        backend="emulate", policy=spec.policy, bubble_policy=common.bubble_policy,
        topology=spec.topology, job=spec.job, plan=plan, shaper=outcome.shaper,
        compute=mode, summary=summary, spans=spans, start=outcome.start,
        status=outcome.status, error=outcome.error, losses=outcome.losses,
        synced_losses=outcome.synced_losses or None, policy_options=common.policy_options,
        backend_block=_block(spec, k, predicted, summary.typical_s, health,
                             memory_record(outcome.memory, memory),
                             resume.resumed_at if resume else [],
                             wan_connections(outcome.wan_sockets, k)),
        inference=typed_inference(
            represented_inference(inference, k),
            None if coordinator.broker is None else prefill_overruns(spans).as_dict()),
        requests=None if coordinator.broker is None else represented_requests(
            coordinator.broker.request_rows(until), k))
    return BackendRun(record, error)


def _in_segments(spec: RunSpec, plan: Plan, chosen: TrainingPolicy, directory: Path,
                 say: Say, mode: EmulatedCompute, k: int, predicted: float | None,
                 memory: MemoryPlan, prediction: Prediction, replan: Planner) -> BackendRun:
    """A run with a scenario's failures, in segments (testbed.run.segments); the prediction
    beside it is the simulator's of the same run, failures and recoveries included, and
    the memory predicted is the first plan's."""
    try:
        simulated = prediction.with_failures(spec, plan, chosen)
        predicted = simulated.typical_s
    except TestbedError as exc:
        say(f"warning: no prediction for this run with its failures: {exc}")
    seen = Segments()
    joined = run_segments(spec, plan, chosen, segment_runner(spec, chosen, directory, mode, k,
                                                             say, seen), say, replan)
    spans = joined_spans(spec, joined)
    summary = summarize(spans, joined.gpus, 0.0, tokens_per_iteration(spec.job, plan),
                        wan_capacity_bps(spec.topology, plan), plan.period, joined.epochs)
    error = joined.error
    status = "interrupted" if isinstance(error, Interrupted) else "failed" if error else "ok"
    health = None if seen.health is None else seen.health.behind(summary.typical_s, predicted)
    if health is not None and health.warning():
        say(f"warning: {health.warning()}")
    record = RunRecord(
        backend="emulate", policy=spec.policy, bubble_policy=None, topology=spec.topology,
        job=spec.job, plan=plan, shaper=seen.shaper, compute=mode, summary=summary,
        spans=spans, start=0.0, status=status, error=str(error) if error else None,
        losses=joined.losses, synced_losses=joined.synced_losses or None,
        policy_options=spec.common.policy_options,
        backend_block=_block(spec, k, predicted, summary.typical_s, health,
                             memory_record(seen.memory, memory), [],
                             wan_connections(seen.wan_sockets, k)),
        recovery=recovery_results(spec, joined))
    return BackendRun(record, error)


def _block(spec: RunSpec, k: int, predicted: float | None, measured: float | None,
           health: Health | None, memory: MeasuredMemory, resumed_at: list[int],
           connections: list[WanConnection]) -> EmulatorBlock:
    """What the emulator alone writes into results.json: its settings, the dilation it
    went at, the simulator's prediction beside the measured iteration, the machine's
    health and memory, its WAN connections' TCP state."""
    emulate = spec.emulate
    return EmulatorBlock(
        allreduce=emulate.allreduce, pacing=emulate.pacing, activations=emulate.activations,
        dilation=k, dilation_requested=emulate.dilation,
        checkpoint_every=spec.common.checkpoint_every or None,
        cluster=None if emulate.cluster is None else describe_run(emulate.cluster),
        resumed_at=resumed_at, predicted_iteration_s=predicted,
        prediction_error=prediction_error(predicted, measured),
        emulation=None if health is None else emulation_record(health), memory=memory,
        wan_connections=connections)


def wan_connections(sockets: Sequence[WanSocket], k: int) -> list[WanConnection]:
    """The results' record of the hosts' WAN sockets, round trips in represented time."""
    return [{"host": s.host, "peer": s.peer, "congestion": s.state.congestion,
             "min_rtt_s": None if s.state.min_rtt_s is None else s.state.min_rtt_s / k,
             "cwnd_segments": s.state.cwnd, "ssthresh_segments": s.state.ssthresh,
             "retransmitted_segments": s.state.retransmitted,
             "bytes_sent": s.state.bytes_sent} for s in sockets]


def emulation_record(health: Health) -> EmulationHealth:
    """Whether the machine kept the pace, as results.json records it."""
    return {"cpu_bound": health.cpu_bound, "cpu_busy": round(health.cpu_busy, 3),
            "workers_cpu": None if health.workers_cpu is None else round(health.workers_cpu, 3),
            "lag_p99_s": health.lag_p99_s,
            "delay_line_late_mean_s": health.delay_line_late_mean_s,
            "delay_line_late_max_s": health.delay_line_late_max_s,
            "reasons": list(health.reasons), "dilation": health.dilation,
            "suggested_dilation": health.suggested_dilation,
            "needed_dilation": health.needed_dilation or health.suggested_dilation,
            "span_cpu_s": health.span_cpu_s, "path_share": health.path_share}


def memory_record(measured: MemoryUse | None, predicted: MemoryPlan) -> MeasuredMemory:
    """The run's peak memory as measured, beside what was predicted before it started."""
    expected: PredictedMemory = {
        "total_bytes": predicted.total, "workers_bytes": predicted.workers * predicted.per_worker,
        "payloads_bytes": predicted.payloads, "network_bytes": predicted.network,
        "coordinator_bytes": predicted.coordinator,
        "connections_bytes": predicted.connection_bytes}
    if measured is None:
        return {"predicted": expected, "available_bytes": available_memory()}
    return {"workers_peak_bytes": measured.workers_peak,
            "largest_worker": measured.largest_worker,
            "largest_worker_bytes": measured.largest_worker_peak,
            "coordinator_peak_bytes": measured.coordinator_peak,
            "predicted": expected, "available_bytes": available_memory()}


def _wall_time(seconds: float) -> str:
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.3g} s"


def prediction_error(predicted: float | None, measured: float | None) -> float | None:
    """The emulator's error against the simulator's iteration time for the same plan
    (positive: the emulator was slower)."""
    if predicted and measured is not None:
        return (measured - predicted) / predicted
    return None


def _choose_dilation(spec: RunSpec, predicted_spans: Sequence[Span], compute: str,
                     plan: Plan, memory: MemoryPlan, say: Say) -> int:
    if spec.emulate.dilation != "auto":
        return spec.emulate.dilation
    from testbed.emulator.runtime.coordinator.capacity import (
        cores,
        machine_capacity_bps,
        worker_costs,
    )

    load = MachineLoad(
        peak_rate_bps(predicted_spans,
                      wan_only=spec.emulate.activations == "auto" and compute == "emulated"),
        machine_capacity_bps(say), spans_per_second(predicted_spans),
        len(plan.used_gpus()), cores(), worker_costs(say),
        busiest_spans_per_second(predicted_spans))
    background = busy_now()
    usable = usable_share(background)
    k = choose_for(load, usable)
    say(f"dilation auto: {k}: at dilation 1 the plan asks of this machine's {load.cores} "
        f"cores {load.forwarding:.0%} to forward its peak {load.peak_bps / 1e9:.2f} Gbit/s "
        f"(it forwards {load.capacity_bps / 1e9:.2f}), {load.bookkeeping:.0%} for the "
        f"workers' {load.spans_per_s:,.0f} actions a second "
        f"({load.costs.span_cpu_s * 1e6:.0f} us of CPU each), both shrinking K-fold, and "
        f"{load.upkeep:.0%} for {load.workers} workers' upkeep, which does not; it may "
        f"use {usable:.0%}, half of what other work leaves ({background:.0%} busy now). "
        f"Its busiest worker's actions take {load.path:.1%} of that worker's time at "
        f"dilation 1, {load.path / k:.1%} at {k} (under {PATH_LIMIT:.0%} keeps its path "
        "the network's). "
        f"Memory ({human_bytes(memory.total)} predicted) is the same at any dilation")
    return k
