"""The simulator's prediction of a run, as the emulator asks for it: the iteration time it
writes beside what it measured, the spans it picks its dilation from, the waits it seeds
the bubble broker with. Its caller hands the emulator one (testbed.experiments.run: the
simulator's, testbed.sim.backend.SimulatorPrediction), so the emulator, the simulator's
sibling, never imports it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from testbed.common.spans import Span
from testbed.inference.bubbles import BubbleBroker
from testbed.inference.workload import WaitKey
from testbed.job.model import Job
from testbed.metrics.summary import Summary
from testbed.plan.model import Plan
from testbed.policy.base import TrainingPolicy
from testbed.run.checkpoint import Progress
from testbed.run.spec import RunSpec


class Prediction(Protocol):
    def check(self, spec: RunSpec, plan: Plan, resume: Progress | None) -> None:
        """Refuse (InputError) what it cannot predict."""

    def iterations(self, spec: RunSpec, job: Job, plan: Plan, policy: TrainingPolicy,
                   broker: BubbleBroker | None) -> tuple[Summary, Sequence[Span]]:
        """The run for `job`'s iterations, without the simulator's own noise: its summary
        and spans (TestbedError where it cannot be predicted)."""

    def with_failures(self, spec: RunSpec, plan: Plan, policy: TrainingPolicy) -> Summary:
        """The whole run with its scenario's failures and recoveries."""

    def waits(self, spec: RunSpec, plan: Plan, policy: TrainingPolicy, scale: float
              ) -> dict[WaitKey, float]:
        """Each GPU's modeled wait at each receive and all-reduce, times `scale`
        (testbed.inference.bubbles.BubbleBroker's seed); empty where not modeled."""
