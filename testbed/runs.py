"""One run of a policy on a topology and job, by either backend, written to its directory.

`up`, `simulate` and `compare` all go through here, so every run directory has the same
files whichever command or backend made it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from testbed.bubbles import BubbleBroker, make_broker, ttft_summary
from testbed.dilation import (
    choose_dilation,
    dilate_events,
    dilate_job,
    dilate_topology,
    peak_rate_bps,
    represented_inference,
    represented_spans,
)
from testbed.errors import TestbedError
from testbed.fsutil import write_atomic
from testbed.inference import dedicated_ttft, kv_bytes, modeled_prefill_s
from testbed.job import Job, dump_job
from testbed.metrics.summary import summarize
from testbed.plan.model import Plan
from testbed.policy import TrainingPolicy, parse_options, training_policy
from testbed.policy.registry import make_plan
from testbed.report.results import RunRecord, write_run
from testbed.resume import check_checkpointable, checkpoints_for, save_settings
from testbed.run_spec import RunSpec
from testbed.runtime.checkpoint import Progress
from testbed.sim.simulate import simulate_plan, tokens_per_iteration, wan_capacity_bps
from testbed.topology import Topology
from testbed.yamlio import to_yaml

Say = Callable[[str], None]


@dataclass
class RunResult:
    results: dict[str, Any]
    directory: Path
    error: TestbedError | None = None


def run(spec: RunSpec, directory: Path, say: Say = lambda _m: None,
        resume: Progress | None = None) -> RunResult:
    """Execute one run; its directory is complete (results.json last) even if it fails.
    `resume`: go on from that checkpoint of this directory's run (emulator)."""
    chosen = training_policy(spec.policy, spec.policy_options)
    plan = make_plan(chosen, spec.topology, spec.job)
    if spec.backend == "emulate":
        from testbed.runtime.preflight import check_emulable

        check_emulable(spec, plan)
        if spec.checkpoint_every or resume:
            check_checkpointable(spec)
    started = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    write_atomic(directory / "job.yaml", to_yaml(dump_job(spec.job)), 0o644)
    if spec.backend == "simulate":
        record = _simulate(spec, plan, chosen)
        error = None
    else:
        record, error = _emulate(spec, plan, chosen, directory, say, resume)
    record.wall_s = time.monotonic() - started
    write_run(directory, record)
    return RunResult(record.results(), directory, error)


PREDICTED_ITERATIONS = 20
"""Iterations the simulator runs to predict an emulated run's iteration time (and peak
rate): enough for the steady state, few enough that a run of a million iterations does
not wait for its prediction."""

def inference_results(topology: Topology, job: Job, plan: Plan, broker: BubbleBroker | None,
                      until: float, dedicated_gpus: int = 1) -> dict[str, Any]:
    """The `inference` block of results.json, with the dedicated-cluster TTFT reference."""
    if broker is None or job.inference is None:
        return {"requests": 0, "served": 0, "rejected": 0, "ttft_s": {"p50": None, "p99": None}}
    out = broker.summary(until)
    workload = job.inference
    named = workload.decode_dc if workload.decode_dc not in (None, "local") else None
    decode = named or topology.dc_of(plan.used_gpus()[0])
    gpu = topology.gpu(plan.used_gpus()[0]).type
    reference = dedicated_ttft(
        [r for r in broker.requests if r.arrival <= until], dedicated_gpus,
        lambda n: modeled_prefill_s(workload, gpu, n),
        lambda n: kv_bytes(workload, n) * 8 / topology.dc(decode).bandwidth_bps)
    out["dedicated"] = {"gpus": dedicated_gpus, "ttft_s": ttft_summary(reference)}
    return out


def _simulate(spec: RunSpec, plan: Plan, chosen: TrainingPolicy) -> RunRecord:
    broker = make_broker(spec.topology, spec.job, plan, spec.bubble_policy,
                         spec.bubble_options)
    summary, spans = simulate_plan(spec.topology, spec.job, plan, chosen, spec.profile,
                                   broker, spec.events)
    end = max((s["end"] for s in spans), default=0.0)
    return RunRecord(
        backend="simulate", policy=spec.policy, bubble_policy=spec.bubble_policy,
        topology=spec.topology, job=spec.job, plan=plan, shaper=None, compute="modeled",
        summary=summary, spans=spans, start=0.0, policy_options=spec.policy_options,
        extra={"profile": bool(spec.profile), "pacing": "assumed",
               "events": [e.as_raw() for e in spec.events],
               "inference": inference_results(spec.topology, spec.job, plan, broker, end)})


def _emulate(spec: RunSpec, plan: Any, chosen: Any, directory: Path, say: Say,
             resume: Progress | None) -> tuple[RunRecord, TestbedError | None]:
    from testbed.runtime.coordinator import Coordinator, Interrupted, RunFailed, run_with_signals
    from testbed.runtime.preflight import choose_compute
    from testbed.runtime.worker import run_loop

    mode = choose_compute(spec.compute, len(plan.used_gpus()))
    broker = make_broker(spec.topology, spec.job, plan, spec.bubble_policy, spec.bubble_options)
    try:
        preview = replace(spec.job, iterations=min(spec.job.iterations, PREDICTED_ITERATIONS))
        simulated, predicted_spans = simulate_plan(spec.topology, preview, plan, chosen,
                                                   spec.profile, broker, spec.events)
        predicted = simulated.median_s
    except TestbedError as exc:  # the emulator can still run the plan
        say(f"warning: no prediction for this run: {exc}")
        predicted, predicted_spans = None, []
    k = _choose_dilation(spec, predicted_spans, mode, say)
    if predicted is not None:
        wall = predicted * (spec.job.iterations + 1) * k
        say(f"the simulator predicts {predicted:.3f} s per iteration; at dilation "
            f"{k} training takes about {_wall_time(wall)} of wall time")
    checkpoints = None
    if spec.checkpoint_every or resume:
        if resume is None:
            save_settings(directory, spec, mode, k)
        checkpoints = checkpoints_for(directory, spec.checkpoint_every, len(list(plan.workers())),
                                      resume)
    coordinator = Coordinator(dilate_topology(spec.topology, k), dilate_job(spec.job, k), plan,
                              chosen, mode, directory / "logs", spec.shaper,
                              spec.stall_timeout_s * k, say,
                              allreduce=spec.allreduce, pacing=spec.pacing,
                              activations=spec.activations, bubble_policy=spec.bubble_policy,
                              bubble_options=spec.bubble_options,
                              events=dilate_events(spec.events, k), dilation=k,
                              checkpoints=checkpoints)
    error: TestbedError | None = None
    try:
        run_loop(run_with_signals(coordinator))
    except (RunFailed, Interrupted) as exc:
        error = exc
    outcome = coordinator.outcome
    if outcome is None:
        raise error or TestbedError("the run ended before it started")
    spans = represented_spans(outcome.spans, outcome.start, k)
    summary = outcome.summary if k == 1 else summarize(
        spans, plan.used_gpus(), outcome.start, tokens_per_iteration(spec.job, plan),
        wan_capacity_bps(spec.topology, plan))
    health = outcome.health
    if health is not None and health.warning():
        say(f"warning: {health.warning()}")
    inference = inference_results(
        coordinator.topology, coordinator.job, plan, coordinator.broker,
        max((s["end"] for s in outcome.spans), default=outcome.start) - outcome.start)
    record = RunRecord(
        backend="emulate", policy=spec.policy, bubble_policy=spec.bubble_policy,
        topology=spec.topology, job=spec.job, plan=plan, shaper=outcome.shaper,
        compute=mode, summary=summary, spans=spans, start=outcome.start,
        status=outcome.status, error=outcome.error, losses=outcome.losses,
        policy_options=spec.policy_options,
        extra={"allreduce": spec.allreduce, "pacing": spec.pacing,
               "activations": spec.activations, "events": [e.as_raw() for e in spec.events],
               "dilation": k, "dilation_requested": spec.dilation,
               "checkpoint_every": spec.checkpoint_every,
               "resumed_at": resume.resumed_at if resume else [],
               **prediction_fields(predicted, summary.median_s),
               "emulation": None if health is None else health.as_dict(),
               "inference": represented_inference(inference, k)})
    return record, error


def _wall_time(seconds: float) -> str:
    if seconds >= 2 * 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.3g} s"


def prediction_fields(predicted: float | None, measured: float | None) -> dict[str, Any]:
    """The simulator's iteration time for the same plan, and the emulator's error against
    it (positive: the emulator was slower)."""
    error = None
    if predicted and measured is not None:
        error = (measured - predicted) / predicted
    return {"predicted_iteration_s": predicted, "prediction_error": error}


def _choose_dilation(spec: RunSpec, predicted_spans: list[dict[str, Any]], compute: str,
                     say: Say) -> int:
    if spec.dilation != "auto":
        return spec.dilation
    from testbed.runtime.capacity import machine_capacity_bps

    peak = peak_rate_bps(predicted_spans,
                         wan_only=spec.activations == "auto" and compute == "emulated")
    capacity = machine_capacity_bps(say)
    k = choose_dilation(peak, capacity)
    say(f"dilation auto: {k} (the plan moves up to {peak / 1e9:.2f} Gbit/s at once; this "
        f"machine forwards {capacity / 1e9:.2f} Gbit/s, half of it kept for the workers)")
    return k


def spec_options(pairs: tuple[str, ...]) -> dict[str, str]:
    return dict(parse_options(pairs))
