"""The simulator as a backend: modeled compute, flow-level network, any scale."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from testbed.backend import BackendRun, Say
from testbed.bubbles import inference_results, make_broker
from testbed.metrics.overruns import prefill_overruns
from testbed.plan.model import Plan
from testbed.policy.base import TrainingPolicy
from testbed.report.results import RunRecord
from testbed.run_spec import RunSpec
from testbed.runtime.checkpoint import Progress
from testbed.sim.bubble_seed import modeled_waits
from testbed.sim.simulate import simulate_plan
from testbed.span_table import last_end


class SimulatorBackend:
    name: Literal["simulate"] = "simulate"

    def check(self, spec: RunSpec, plan: Plan, resume: Progress | None) -> None:
        """Whatever plan validated, the simulator runs: torch's whole schedule language
        (virtual stages, split backwards, overlapped units) included."""

    def execute(self, spec: RunSpec, plan: Plan, policy: TrainingPolicy, directory: Path,
                say: Say, resume: Progress | None) -> BackendRun:
        return BackendRun(self.record(spec, plan, policy))

    def record(self, spec: RunSpec, plan: Plan, policy: TrainingPolicy) -> RunRecord:
        """The run in memory: the simulator writes nothing of its own."""
        seed = modeled_waits(spec.topology, spec.job, plan, policy, spec.profile) \
            if spec.bubble_policy else {}
        broker = make_broker(spec.topology, spec.job, plan, spec.bubble_policy,
                             spec.bubble_options, seed)
        summary, spans = simulate_plan(spec.topology, spec.job, plan, policy, spec.profile,
                                       broker, spec.events, spec.jitter)
        end = last_end(spans)
        inference = inference_results(spec.topology, spec.job, plan, broker, end)
        if broker is not None:
            inference["overruns"] = prefill_overruns(spans).as_dict()
        return RunRecord(
            backend="simulate", policy=spec.policy, bubble_policy=spec.bubble_policy,
            topology=spec.topology, job=spec.job, plan=plan, shaper=None, compute="modeled",
            summary=summary, spans=spans, start=0.0, policy_options=spec.policy_options,
            extra={"profile": bool(spec.profile), "pacing": "assumed",
                   "jitter": spec.jitter.as_dict() if spec.jitter else None,
                   "events": [e.as_raw() for e in spec.events],
                   "inference": inference},
            requests=None if broker is None else broker.request_rows(end))
