"""One run of a policy on a topology and job, by either backend, written to its directory.

`up`, `simulate` and `compare` all go through here, so every run directory has the same
files whichever command or backend made it.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

from testbed.common.choices import BackendName
from testbed.common.codec import JsonObject
from testbed.common.fsutil import write_atomic
from testbed.common.heap import old_objects_frozen
from testbed.common.span_table import last_end
from testbed.common.yamlio import to_yaml
from testbed.errors import InputError, TestbedError, TestbedWarning
from testbed.experiments.planning import plan_with_simulator
from testbed.inference.memory import check_inference_memory
from testbed.job.load import dump_job
from testbed.plan.host_tcp import hosts_as_planned
from testbed.plan.model import Plan
from testbed.policy import bubble_policy, training_policy
from testbed.policy.base import TrainingPolicy
from testbed.policy.loss_models import check_reachable, declared_effect, loss_model
from testbed.report.results import RunRecord, write_run
from testbed.report.run_dirs import holding
from testbed.report.run_results import Results
from testbed.run.backend import Backend, Say
from testbed.run.checkpoint import Progress
from testbed.run.spec import RunSpec
from testbed.scenario.reach import (
    applied_results,
    entries,
    iterations_to_reach,
    late_warning,
    reach,
)


@dataclass
class RunResult:
    typed: Results
    """results.json as types (testbed.report.run_results)."""
    directory: Path
    error: TestbedError | None = None
    """Why the run ended early (its results are written all the same)."""
    record: RunRecord | None = None
    """What made the results: plan, summary, spans."""

    @cached_property
    def results(self) -> JsonObject:
        """results.json as written: the document, for code that reads JSON."""
        return self.typed.document()


def run(spec: RunSpec, directory: Path, say: Say = lambda _m: None,
        resume: Progress | None = None) -> RunResult:
    """Execute one run; its directory is complete (results.json last) even if it fails.
    `resume`: go on from that checkpoint of this directory's run (emulator)."""
    spec, plan, chosen = prepare(spec, say)
    backend = backend_for(spec.backend)
    try:
        backend.check(spec, plan, resume)
    except InputError as exc:  # what the backend refuses of a given plan is in its file
        if spec.common.plan_file is None or exc.source != f"-p {plan.policy}":
            raise
        raise exc.at(spec.common.plan_file) from None
    started = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    with holding(directory):  # one process at a time writes here (testbed.report.run_dirs)
        write_atomic(directory / "job.yaml", to_yaml(dump_job(spec.job)), 0o644)
        outcome = backend.execute(spec, plan, chosen, directory, say, resume)
        record, error = outcome.record, outcome.error
        reached(spec, record)
        predicting(spec, plan, chosen, record)
        record.wall_s = time.monotonic() - started
        record.target_loss = spec.common.target_loss
        record.plan_file = spec.common.plan_file
        record.trace = spec.common.trace
        with old_objects_frozen():  # the record: what the files are written from
            results = write_run(directory, record)
    if results.trace.left_out:
        say(results.trace.left_out)
    return RunResult(results, directory, error, record)


def prepare(spec: RunSpec, say: Say) -> tuple[RunSpec, Plan, TrainingPolicy]:
    """The run as it will go: the policy's plan, whole cycles of it, the host TCP settings
    it asks for, and memory for the prefills it will take."""
    common = spec.common  # its target loss a number above 0 (testbed.run.spec.Common)
    model = loss_model(common.loss_model)
    if common.target_loss is not None and (
            spec.backend == "simulate" or spec.emulate.compute == "emulated"):  # no loss measured
        check_reachable(model, common.target_loss)
    chosen = training_policy(spec.policy, common.policy_options)
    plan = common.plan if common.plan is not None else \
        plan_with_simulator(chosen, spec.topology, spec.job, say=say)
    spec = whole_cycles(spec, plan.period)
    # the host TCP settings the plan asks for, on both backends and in the run's topology.yaml
    spec = replace(spec, topology=hosts_as_planned(spec.topology, plan))
    if common.bubble_policy is not None and bubble_policy(common.bubble_policy,
                                                          common.bubble_options).fills:
        check_inference_memory(spec.topology, spec.job, plan)
    return spec, plan, chosen


def simulated(spec: RunSpec) -> RunRecord:
    """A simulated run kept in memory, no directory written: a sweep's thousands of points
    keep a row each, not a directory of spans."""
    from testbed.sim.backend import SimulatorBackend

    spec, plan, chosen = prepare(replace(spec, backend="simulate"), lambda _m: None)
    record = SimulatorBackend(plan_with_simulator).record(spec, plan, chosen)
    reached(spec, record)
    predicting(spec, plan, chosen, record)
    record.target_loss = spec.common.target_loss
    return record


def predicting(spec: RunSpec, plan: Plan, chosen: TrainingPolicy, record: RunRecord) -> None:
    """The loss model and the method's effect on loss per token, for the run's results
    (`loss_model`, and the predicted time to the target where the run trains no model)."""
    record.loss_model = loss_model(spec.common.loss_model)
    record.loss_effect = declared_effect(chosen, plan, spec.topology)


def reached(spec: RunSpec, record: RunRecord) -> None:
    """Which of the run's events and scenario entries its training reached, in its results
    (`applied`, whichever backend ran it); a run that completed before some of them began
    warns, naming them and the `--iterations` that would reach them (from its own
    iteration time)."""
    failed = [(f["worker"], f["at_s"]) for f in record.recovery.failures] \
        if record.recovery else []
    found = reach(entries(spec.common.events, spec.scenario), last_end(record.spans) - record.start,
                  failed)
    record.applied = applied_results(spec.common.events, spec.scenario, found)
    late, summary = found.late, record.summary
    if not late or record.status != "ok":
        return  # a run that stopped early says why itself
    ends, typical = summary.iteration_ends_s, summary.typical_s
    iterations = None if not ends or not typical else iterations_to_reach(
        max(e.at_s for e in late), len(ends), ends[-1], typical, summary.period)
    warnings.warn(late_warning(late, found.end_s, iterations, typical), TestbedWarning,
                  stacklevel=1)


def whole_cycles(spec: RunSpec, period: int) -> RunSpec:
    """A plan whose iterations differ (a sync every H) runs whole cycles: tokens per second
    over part of a cycle would leave the sync out, or count it too often. Every command
    that changes what was asked says so: here, as a TestbedWarning (the CLI's one line on
    stderr, a Python warning to API users), once per policy and count."""
    iterations = spec.job.iterations
    if iterations % period == 0:
        return spec
    whole = -(-iterations // period) * period
    warnings.warn(f"{spec.policy}: running {whole} iterations, not {iterations}: the plan's "
                  f"cycle is {period} iterations long, and a run measures whole cycles",
                  TestbedWarning, stacklevel=1)
    return replace(spec, job=replace(spec.job, iterations=whole))


def backend_for(name: BackendName) -> Backend:
    """The backend by name, imported only when asked for: a simulation never loads the
    emulator's runtime. Each is handed what plans again after a failure (the simulator
    at the policy's disposal); the emulator also the simulator's prediction of its run,
    which it writes beside what it measures."""
    from testbed.sim.backend import SimulatorBackend, SimulatorPrediction

    if name == "simulate":
        return SimulatorBackend(plan_with_simulator)
    from testbed.emulator.backend import EmulatorBackend

    return EmulatorBackend(SimulatorPrediction(plan_with_simulator), plan_with_simulator)
