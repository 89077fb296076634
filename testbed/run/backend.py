"""The two ways to run a plan behind one interface, so that `testbed.experiments.run` only
dispatches: the simulator (testbed.sim.backend) and the emulator (testbed.emulator.backend).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from testbed.common.choices import BackendName
from testbed.common.codec import from_json
from testbed.errors import TestbedError
from testbed.inference.bubbles import InferenceSummary
from testbed.metrics.overruns import OverrunCounts
from testbed.plan.model import Plan
from testbed.policy.base import TrainingPolicy
from testbed.report.results import RunRecord
from testbed.report.run_results import Inference
from testbed.run.checkpoint import Progress
from testbed.run.spec import RunSpec

Say = Callable[[str], None]


@dataclass
class BackendRun:
    record: RunRecord
    error: TestbedError | None = None
    """Why the run ended early; what it measured is in `record` all the same."""


class Backend(Protocol):
    @property
    def name(self) -> BackendName: ...

    def check(self, spec: RunSpec, plan: Plan, resume: Progress | None) -> None:
        """Refuse (InputError) what this backend cannot run, before anything is written."""

    def execute(self, spec: RunSpec, plan: Plan, policy: TrainingPolicy, directory: Path,
                say: Say, resume: Progress | None) -> BackendRun:
        """Run the plan; `resume`: go on from that checkpoint of `directory`'s run."""


def typed_inference(block: InferenceSummary, overruns: OverrunCounts | None = None
                    ) -> Inference:
    """results.json's `inference` block as its type (testbed.report.run_results), with
    how often prefills held training past their bubbles where bubbles were filled."""
    typed: Inference = from_json({**block, **({"overruns": overruns} if overruns else {})},
                                 Inference, "inference")
    return typed
