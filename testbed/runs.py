"""One run of a policy on a topology and job, by either backend, written to its directory.

`up`, `simulate` and `compare` all go through here, so every run directory has the same
files whichever command or backend made it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.errors import TestbedError
from testbed.job import Job, dump_job
from testbed.metrics.summary import Summary, summarize
from testbed.plan.model import Plan
from testbed.policy import TrainingPolicy, parse_options, training_policy
from testbed.policy.registry import make_plan
from testbed.report.results import RunRecord, write_run
from testbed.sim.engine import Simulator
from testbed.sim.profile import Profile
from testbed.topology import Topology
from testbed.yamlio import to_yaml

Say = Callable[[str], None]


@dataclass
class RunSpec:
    """Everything that decides a run; written with it so it can be run again."""

    backend: str
    topology: Topology
    job: Job
    policy: str
    policy_options: dict[str, str]
    bubble_policy: str | None = None
    compute: str = "auto"
    shaper: str = "auto"
    allreduce: str = "auto"
    stall_timeout_s: float = 120.0
    profile: Profile | None = None


@dataclass
class RunResult:
    results: dict[str, Any]
    directory: Path
    error: TestbedError | None = None


def run(spec: RunSpec, directory: Path, say: Say = lambda _m: None) -> RunResult:
    """Execute one run; its directory is complete (results.json last) even if it fails."""
    chosen = training_policy(spec.policy, spec.policy_options)
    plan = make_plan(chosen, spec.topology, spec.job)
    started = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "job.yaml").write_text(to_yaml(dump_job(spec.job)))
    if spec.backend == "simulate":
        record = _simulate(spec, plan, chosen)
        error = None
    else:
        record, error = _emulate(spec, plan, chosen, directory, say)
    record.wall_s = time.monotonic() - started
    write_run(directory, record)
    return RunResult(record.results(), directory, error)


def simulate_plan(topology: Topology, job: Job, plan: Plan, policy: TrainingPolicy,
                  profile: Profile | None = None) -> tuple[Summary, list[dict[str, Any]]]:
    """Simulate a plan; the summary and spans, computed exactly as for the emulator."""
    try:
        result = Simulator(topology, job, plan, policy, profile).run()
    except RuntimeError as exc:
        raise TestbedError(f"simulation failed: {exc}") from None
    tokens = plan.dp * plan.microbatches * plan.microbatch_size * job.model.seq_len
    capacity = sum(topology.bottleneck_bps(a, b) for a, b in plan.sharing)
    return summarize(result.spans, plan.used_gpus(), result.start, tokens, capacity), \
        result.spans


def _simulate(spec: RunSpec, plan: Plan, chosen: TrainingPolicy) -> RunRecord:
    summary, spans = simulate_plan(spec.topology, spec.job, plan, chosen, spec.profile)
    return RunRecord(
        backend="simulate", policy=spec.policy, bubble_policy=spec.bubble_policy,
        topology=spec.topology, job=spec.job, plan=plan, shaper=None, compute="modeled",
        summary=summary, spans=spans, start=0.0, policy_options=spec.policy_options,
        extra={"profile": bool(spec.profile)})


def _emulate(spec: RunSpec, plan: Any, chosen: Any, directory: Path,
             say: Say) -> tuple[RunRecord, TestbedError | None]:
    from testbed.runtime.coordinator import (
        Coordinator,
        Interrupted,
        RunFailed,
        choose_compute,
        run_with_signals,
    )
    from testbed.runtime.worker import run_loop

    mode = choose_compute(spec.compute, len(plan.used_gpus()))
    coordinator = Coordinator(spec.topology, spec.job, plan, chosen, mode,
                              directory / "logs", spec.shaper, spec.stall_timeout_s, say,
                              allreduce=spec.allreduce)
    error: TestbedError | None = None
    try:
        run_loop(run_with_signals(coordinator))
    except (RunFailed, Interrupted) as exc:
        error = exc
    outcome = coordinator.outcome
    if outcome is None:
        raise error or TestbedError("the run ended before it started")
    record = RunRecord(
        backend="emulate", policy=spec.policy, bubble_policy=spec.bubble_policy,
        topology=spec.topology, job=spec.job, plan=plan, shaper=outcome.shaper,
        compute=mode, summary=outcome.summary, spans=outcome.spans, start=outcome.start,
        status=outcome.status, error=outcome.error, losses=outcome.losses,
        policy_options=spec.policy_options, extra={"allreduce": spec.allreduce})
    return record, error


def spec_options(pairs: tuple[str, ...]) -> dict[str, str]:
    return dict(parse_options(pairs))
