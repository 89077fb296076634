"""A plan through the simulator, summarized exactly as an emulated run is: what `simulate`,
the emulator's prediction, sweeps, benchmarks and Atlas's plan search all call."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from testbed.common.span_table import SpanTable
from testbed.common.spans import Span, SpanDetail, SpanKind
from testbed.errors import TestbedError
from testbed.inference.bubbles import BubbleBroker
from testbed.job.model import Job
from testbed.metrics.summary import STEP_KINDS, Summary, run_iteration_s, summarize
from testbed.plan.jitter import Jitter
from testbed.plan.model import Plan
from testbed.plan.profile import Profile
from testbed.plan.throughput import tokens_per_iteration, wan_capacity_bps
from testbed.policy.base import TrainingPolicy
from testbed.scenario.slowdowns import Straggler
from testbed.sim.pair_states import PairState, pair_states
from testbed.sim.simulator import SimResult, Simulator
from testbed.topology.model import Topology
from testbed.topology.net_events import NetEvent


@dataclass(frozen=True)
class SimulatedRun:
    summary: Summary
    spans: Sequence[Span]
    connections: tuple[PairState, ...]
    """Its WAN pairs' TCP state at the end (testbed.sim.pair_states)."""


def simulate_run(topology: Topology, job: Job, plan: Plan, policy: TrainingPolicy,
                 profile: Profile | None = None,
                 broker: BubbleBroker | None = None, events: tuple[NetEvent, ...] = (),
                 jitter: Jitter | None = None, stragglers: tuple[Straggler, ...] = ()
                 ) -> SimulatedRun:
    """Simulate a plan; the summary and spans, computed exactly as for the emulator, and
    where its connections' slow starts now stop. `events`: what changes the links (network
    events, link traces' steps); `stragglers`: slower compute
    (testbed.scenario.slowdowns)."""
    simulator = Simulator(topology, job, plan, policy, profile, bubbles=broker, events=events,
                          jitter=jitter, stragglers=stragglers)
    result = _run(simulator)
    summary = summarize(result.spans, plan.used_gpus(), result.start,
                        tokens_per_iteration(job, plan), wan_capacity_bps(topology, plan),
                        plan.period)
    return SimulatedRun(summary, result.spans,
                        pair_states(simulator.transfers.pairs, simulator.topology))


def simulate_plan(topology: Topology, job: Job, plan: Plan, policy: TrainingPolicy,
                  profile: Profile | None = None,
                  broker: BubbleBroker | None = None, events: tuple[NetEvent, ...] = (),
                  jitter: Jitter | None = None, stragglers: tuple[Straggler, ...] = ()
                  ) -> tuple[Summary, Sequence[Span]]:
    """`simulate_run`'s summary and spans."""
    run = simulate_run(topology, job, plan, policy, profile, broker, events, jitter,
                       stragglers)
    return run.summary, run.spans


def simulated_iteration_s(topology: Topology, job: Job, plan: Plan, policy: TrainingPolicy,
                          stop_above: float | None = None) -> float | None:
    """The plan's typical iteration time only (what planning compares: the median, or for
    a cycle the mean over whole cycles), without the rest of the summary; the same figure
    `simulate_plan`'s summary gets its tokens/s from. With `stop_above`, a run whose
    median must exceed it stops there, and the answer is then a lower bound, itself above
    `stop_above` (a cycle runs to its end: see Simulator). Only the steps' spans are
    kept: the iteration ends are all it reads (a run keeps hundreds of thousands)."""
    result = _run(Simulator(topology, job, plan, policy, stop_above=stop_above,
                            spans=StepRows()))
    if result.median_at_least is not None:
        return result.median_at_least
    return run_iteration_s(result.spans, plan.used_gpus(), result.start, plan.period)


class StepRows(SpanTable):
    """A span table that keeps the optimizer steps' rows alone (testbed.metrics.summary's
    iteration_ends reads no others) and drops the rest as they come."""

    def add(self, gpus: tuple[str, ...], kind: SpanKind, start: float, end: float,
            iteration: int, detail: SpanDetail) -> None:
        if kind in STEP_KINDS:
            super().add(gpus, kind, start, end, iteration, detail)


def _run(simulator: Simulator) -> SimResult:
    try:
        return simulator.run()
    except RuntimeError as exc:
        raise TestbedError(f"simulation failed: {exc}") from None

