"""The emulator's segments of a run with a scenario's failures (testbed.run.segments): each
one a coordinator of its own (network, workers, training) that ends when the failure
kills a worker; the next goes on from the newest complete checkpoint, as `up --resume`
does, on the same GPUs or, replanned, with the state moved to the new placement."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

from testbed.common.choices import EmulatedCompute
from testbed.common.owners import process_start_ticks
from testbed.emulator.resume import checkpoints_for
from testbed.emulator.runtime.coordinator.capacity import worker_costs
from testbed.emulator.runtime.coordinator.coordinator import Coordinator, Interrupted
from testbed.emulator.runtime.coordinator.health import Health
from testbed.emulator.runtime.coordinator.hosts import WanSocket
from testbed.emulator.runtime.coordinator.memory import MemoryUse
from testbed.emulator.runtime.coordinator.preflight import check_emulable
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.emulator.runtime.coordinator.signals import run_to_the_end
from testbed.errors import TestbedError
from testbed.plan.model import Plan
from testbed.policy.base import TrainingPolicy
from testbed.run.backend import Say
from testbed.run.checkpoint import Checkpoints, Progress, iteration_dir, shifted
from testbed.run.dilation import represented_spans
from testbed.run.segments import RunSegment, Segment, SegmentResult
from testbed.run.spec import RunSpec


@dataclasses.dataclass
class Segments:
    """What the emulator's segments leave besides their spans."""

    shaper: str | None = None
    health: Health | None = None
    """The last segment's (the machine's load in it)."""
    memory: MemoryUse | None = None
    """The segment whose workers' peaks summed highest."""
    wan_sockets: list[WanSocket] = dataclasses.field(default_factory=list)
    """The last segment's, as its training ended."""


def segment_runner(spec: RunSpec, policy: TrainingPolicy, directory: Path,
                   compute: EmulatedCompute, k: int, say: Say, seen: Segments) -> RunSegment:
    """Runs one segment through a coordinator, at dilation `k`; each segment's worker
    logs go to `logs` (the first) or `logs-N`."""

    def run(segment: Segment) -> SegmentResult:
        try:
            if segment.restore is not None:  # a new plan: can this machine hold it?
                check_emulable(dataclasses.replace(spec, topology=segment.topology),
                               segment.plan)
            checkpoints = _checkpoints(spec, directory, segment, compute)
        except TestbedError as exc:
            return SegmentResult([], error=exc)
        scenario = dataclasses.replace(
            spec.scenario, stragglers=segment.stragglers, failures=segment.losses)
        config = RunConfig.for_spec(
            spec, segment.topology, segment.plan, policy, compute,
            directory / ("logs" if not segment.index else f"logs-{segment.index + 1}"), k,
            segment.events, scenario, checkpoints=checkpoints,
            action_cpu_s=worker_costs(say).span_cpu_s)
        coordinator = Coordinator(config, say=say)
        try:
            outcome, error = run_to_the_end(coordinator)
        finally:
            if checkpoints is not None and checkpoints.moved is not None:
                shutil.rmtree(checkpoints.moved, ignore_errors=True)
        if outcome is None:
            return SegmentResult([], error=error or TestbedError("the run ended before it "
                                                                 "started"))
        seen.shaper, seen.health = outcome.shaper, outcome.health
        seen.wan_sockets = outcome.wan_sockets
        if outcome.memory is not None and (
                seen.memory is None or outcome.memory.workers_peak > seen.memory.workers_peak):
            seen.memory = outcome.memory
        spans = shifted(represented_spans(outcome.spans, outcome.start, k), -outcome.start)
        lost = coordinator.timed.lost if coordinator.timed else None
        lost_here = None
        if lost is not None and not isinstance(error, Interrupted):
            lost_here = segment.losses[config.losses.index(lost)]
            error = None
        return SegmentResult([s for s in spans if s["kind"] != "net_event"], lost_here,
                             checkpoints.committed if checkpoints else 0,
                             dict(outcome.losses), error, dict(outcome.synced_losses))

    return run


def _checkpoints(spec: RunSpec, directory: Path, segment: Segment,
                 compute: EmulatedCompute) -> Checkpoints | None:
    """The segment's checkpoints: going on from the one it starts at (its state moved to
    the new placement, where replanned with real compute)."""
    if not spec.common.checkpoint_every:
        return None
    workers = len(segment.plan.used_gpus())  # a part per GPU, whatever stages it holds
    if not segment.first_iteration:
        return checkpoints_for(directory, spec.common.checkpoint_every, workers, None)
    pid = os.getpid()
    prior = Progress(segment.first_iteration, {}, [], pid, process_start_ticks(pid) or 0)
    checkpoints = checkpoints_for(directory, spec.common.checkpoint_every, workers, prior)
    if segment.restore is not None and compute == "real":
        from testbed.emulator.runtime.worker.compute.reshard import reshard

        before: Plan = segment.restore[0]
        moved = checkpoints.directory / f"moved-{segment.index}"
        reshard(iteration_dir(checkpoints.directory, segment.first_iteration), before.layers,
                moved, segment.plan.layers, segment.plan.dp, spec.job.model, spec.job.seed)
        checkpoints.moved = moved
    return checkpoints
