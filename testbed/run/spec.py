"""What decides a run, whichever backend runs it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from testbed.common.choices import (
    ActivationsChoice,
    AllReduceChoice,
    BackendName,
    ComputeChoice,
    OnFailure,
    ShaperChoice,
    TraceChoice,
)
from testbed.job.model import Job
from testbed.plan.model import Plan
from testbed.policy.loss_models import DEFAULT_LOSS_MODEL
from testbed.scenario.scenario import Scenario
from testbed.sim.jitter import Jitter
from testbed.sim.profile import Profile
from testbed.topology import Topology
from testbed.topology.net_events import NetEvent
from testbed.topology.seats import ClusterRun


@dataclass
class RunSpec:
    """Everything that decides a run; written with it so it can be run again."""

    backend: BackendName
    topology: Topology
    job: Job
    policy: str
    """The policy that plans the run; with `plan`, the one whose hooks run it and that
    labels it (testbed.policy.given)."""
    policy_options: dict[str, str]
    bubble_policy: str | None = None
    bubble_options: dict[str, str] | None = None
    compute: ComputeChoice = "auto"
    shaper: ShaperChoice = "auto"
    allreduce: AllReduceChoice = "auto"
    stall_timeout_s: float = 120.0
    profile: Profile | None = None
    events: tuple[NetEvent, ...] = ()
    pacing: bool = True
    activations: ActivationsChoice = "auto"
    dilation: int | Literal["auto"] = 1
    """Emulate K times slower than represented time (testbed.run.dilation); "auto" picks K."""
    jitter: Jitter | None = None
    """Simulator: seeded noise on compute, prefill and transfer delays (testbed.sim.jitter)."""
    wall_budget_s: float | None = None
    """Emulator: refuse, before anything starts, a run the simulator predicts would take
    longer than this of wall time at its dilation; None for no limit."""
    checkpoint_every: int = 0
    """Emulator: checkpoint every N iterations and at the end (testbed.run.checkpoint);
    0 for never."""
    cluster: ClusterRun | None = None
    """Emulator: run across the machines of a cluster, coordinated from this one."""
    plan: Plan | None = None
    """A given plan to run instead of the policy's (`--plan FILE`), already checked
    (testbed.plan.load.given_plan)."""
    plan_file: str | None = None
    """Where `plan` was read from (None for a Plan handed to the Python API); recorded in
    results.json."""
    target_loss: float | None = None
    """Report the represented time and tokens to the first step whose loss is at most this
    (results' `time_to_loss`); a run without real compute says it has no loss."""
    trace: TraceChoice = "summary"
    """How much of the run trace.json.gz draws (testbed.report.chrome)."""
    scenario: Scenario = field(default_factory=Scenario)
    """Link traces, stragglers and failures during the run (its events are in `events`)."""
    on_failure: OnFailure = "stop"
    """What a scenario's failure does to the run (testbed.run.recovery)."""
    loss_model: str = DEFAULT_LOSS_MODEL
    """What predicts the loss (results' `loss_model`, and the time to `target_loss` where
    the run trains no model): the built-in model or an installed one
    (testbed.policy.loss_models)."""

    @property
    def link_events(self) -> tuple[NetEvent, ...]:
        """What changes the links during the run: the scenario's traces beneath the
        events."""
        return self.scenario.link_events() + self.events
