"""What an emulated run was asked to do: fixed before it starts, read by every part."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.common.choices import ActivationsChoice, AllReduceChoice, EmulatedCompute, ShaperChoice
from testbed.inference.workload import WaitKey
from testbed.job.model import Job
from testbed.plan.model import Plan
from testbed.policy.base import TrainingPolicy
from testbed.run.checkpoint import Checkpoints
from testbed.run.dilation import dilate_events, dilate_job, dilate_topology
from testbed.run.spec import Common, EmulatorSettings, RunSpec
from testbed.scenario.scenario import Scenario, WorkerLoss, dilated
from testbed.scenario.slowdowns import Straggler
from testbed.topology.model import Topology
from testbed.topology.net_events import NetEvent
from testbed.topology.seats import ClusterRun


@dataclass(frozen=True)
class RunConfig:
    """An emulated run: a RunSpec's choices (its defaults are the spec's), with what the
    run was given to do at its dilation. `for_spec` makes one from a RunSpec."""

    topology: Topology
    """As emulated: dilated when `dilation` > 1."""
    job: Job
    plan: Plan
    policy: TrainingPolicy
    compute: EmulatedCompute
    """Timed sleeps or torch."""
    log_dir: Path
    shaper: ShaperChoice = EmulatorSettings.shaper
    stall_timeout_s: float = EmulatorSettings.stall_timeout_s
    save_dir: Path | None = None
    """Where workers write their stage's final parameters (real compute)."""
    allreduce: AllReduceChoice = EmulatorSettings.allreduce
    """"real": send every gradient byte; "auto": model intra-DC rings in emulated compute."""
    pacing: bool = EmulatorSettings.pacing
    """Cap each cross-DC connection at its share of the path's rate (testbed.plan.pacing)."""
    activations: ActivationsChoice = EmulatorSettings.activations
    """"auto": with emulated compute, activations between stages in one DC are modeled at
    the DC's bandwidth; "real": they cross the network as real bytes."""
    bubble_policy: str | None = Common.bubble_policy
    bubble_options: dict[str, str] | None = Common.bubble_options
    bubble_seed: dict[WaitKey, float] = field(default_factory=dict)
    """Modeled waits per (GPU, action), dilated: bubble predictions before any is measured."""
    events: tuple[NetEvent, ...] = Common.events
    """Network events applied during training, at times from its start."""
    dilation: int = 1
    """Real seconds per represented second; the topology and times given are dilated."""
    checkpoints: Checkpoints | None = None
    """Where and how often the run checkpoints, and what it resumed from (if it did)."""
    cluster: ClusterRun | None = None
    """A run across machines: the cluster, and this machine (its coordinator)."""
    stragglers: tuple[Straggler, ...] = ()
    """Slower compute during training (testbed.scenario.slowdowns), dilated."""
    losses: tuple[WorkerLoss, ...] = ()
    """The scenario's failures to come, dilated: the first that takes a worker of the
    plan ends the run (testbed.run.segments goes on from there)."""
    action_cpu_s: float | None = None
    """The CPU a worker action costs this machine besides any compute, as calibrated
    (testbed.emulator.runtime.coordinator.capacity.worker_costs): what the run's check
    weighs its busiest worker's path by (None: not weighed). Not the run's own CPU per
    span, which holds a real compute's work, and grows with K as slower links split the
    same bytes into more, smaller writes, CPU that overlaps the wait for the network."""

    @classmethod
    def for_spec(cls, spec: RunSpec, topology: Topology, plan: Plan, policy: TrainingPolicy,
                 compute: EmulatedCompute, log_dir: Path, k: int,
                 events: Iterable[NetEvent], scenario: Scenario, **rest: Any) -> RunConfig:
        """`spec` run at dilation `k` on `topology` (the spec's, or a segment's after a
        failure): it, the job, the stall timeout, `events` and `scenario`'s stragglers
        and failures dilated; the spec's other choices as they are."""
        slowed, emulate, common = dilated(scenario, k), spec.emulate, spec.common
        return cls(dilate_topology(topology, k), dilate_job(spec.job, k), plan, policy,
                   compute, log_dir, shaper=emulate.shaper,
                   stall_timeout_s=emulate.stall_timeout_s * k, allreduce=emulate.allreduce,
                   pacing=emulate.pacing, activations=emulate.activations,
                   bubble_policy=common.bubble_policy, bubble_options=common.bubble_options,
                   events=dilate_events(events, k), dilation=k, cluster=emulate.cluster,
                   stragglers=slowed.stragglers, losses=slowed.failures, **rest)

    def decode_dcs(self, with_bubbles: bool) -> tuple[str, ...]:
        """DCs that get a decode server: the workload's named one, else every DC used."""
        if not with_bubbles:
            return ()
        named = self.job.inference.decode_dc if self.job.inference else None
        if named and named != "local":
            return (named,)
        return tuple(dict.fromkeys(self.topology.dc_of(g) for g in self.plan.used_gpus()))
