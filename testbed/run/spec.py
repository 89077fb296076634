"""What decides a run, whichever backend runs it: one frozen tree, written with the run so
it can be run again. What every run has (`Common`), the scenario it meets, the
simulator's part and the emulator's part; each field documented by the docstring under
it, which is also its option's help (testbed.run.settings): the options of `up`,
`simulate`, `compare` and `sweep` and the Python API's parameters are made from these
fields. A field without a `Setting` comes from the inputs (the topology, its events, the
scenario file) or is set by the code that runs it (the plan's file, a cluster's run)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any, Literal

from testbed.common.choices import (
    ActivationsChoice,
    AllReduceChoice,
    BackendName,
    ComputeChoice,
    OnFailure,
    ShaperChoice,
    TraceChoice,
    values_of,
)
from testbed.errors import InputError
from testbed.job.model import Job
from testbed.metrics.loss import check_target_loss
from testbed.plan.jitter import Jitter, parse_jitter
from testbed.plan.model import Plan
from testbed.plan.profile import Profile, load_profile
from testbed.policy.loss_models import DEFAULT_LOSS_MODEL
from testbed.policy.registry import DEFAULT_POLICY
from testbed.run.dilation import MAX_DILATION
from testbed.run.settings import Command, Named, setting, settings_of
from testbed.scenario.scenario import Scenario
from testbed.topology import Topology
from testbed.topology.net_events import NetEvent
from testbed.topology.seats import ClusterRun

ONE: tuple[Command, ...] = ("up", "simulate")
"""The commands of one run."""
RUNS: tuple[Command, ...] = ("up", "simulate", "compare")
"""The commands that run whole runs, one or many."""
ALL: tuple[Command, ...] = ("up", "simulate", "compare", "sweep")


def parse_dilation(text: str) -> int | Literal["auto"]:
    """`--dilation`: a whole number from 1 to MAX_DILATION, or auto."""
    if text == "auto":
        return "auto"
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_DILATION:
        raise InputError(f"must be a whole number from 1 to {MAX_DILATION}, or auto "
                         f"(got {text!r})", "--dilation")
    return value


def parse_target_loss(text: str) -> float:
    """`--target-loss`: a loss a cross-entropy can reach."""
    try:
        target = float(text)
    except ValueError:
        target = math.nan
    return check_target_loss(target, "--target-loss", text)


def parse_jitter_option(text: str) -> Jitter:
    """`--jitter`: one coefficient of variation, or one per kind."""
    try:
        return parse_jitter(text)
    except ValueError as exc:
        raise InputError(str(exc), "--jitter") from None


def parse_on_off(text: str) -> bool:
    if text not in ("on", "off"):
        raise InputError(f"must be on or off, got {text!r}", "--pacing")
    return text == "on"


def parse_profile(text: str) -> Profile:
    return load_profile(Path(text))


@dataclass(frozen=True)
class Common:
    """What every run has, whichever backend runs it."""

    policy: str = field(default=DEFAULT_POLICY, metadata=setting(
        "-p", "--policy", commands=ONE))
    """Training policy (see `testbed plugins`)."""
    policy_options: dict[str, str] = field(default_factory=dict, metadata=setting(
        "-o", "--option", commands=ONE, metavar="KEY=VALUE", multiple=True, api="options"))
    """Policy option (see `testbed plugins`). Repeatable."""
    plan: Plan | None = field(default=None, metadata=setting(
        "--plan", commands=ONE, metavar="FILE", file=True))
    """Run this plan instead of asking the policy for one: a plan's CSV (`testbed plan
    --csv`, saved or edited by hand) or torch's CSV form of a pipeline schedule; validated
    and dry-run first. -p then makes no plan: it labels the run and answers the plan's
    hooks (who gets an arbitrated WAN link next); by default the policy the plan records,
    or plan-file (first come first served) when that one is not installed."""
    plan_file: str | None = None
    """Where `plan` was read from (None for a Plan handed to the Python API); recorded in
    results.json."""
    bubble_policy: str | None = field(default=None, metadata=setting(
        "-b", "--bubble", commands=ONE, api="bubble"))
    """Bubble policy filling training bubbles with prefill requests from the job's
    inference workload (see `testbed plugins`)."""
    bubble_options: dict[str, str] | None = field(default=None, metadata=setting(
        "-B", "--bubble-option", commands=ONE, metavar="KEY=VALUE", multiple=True))
    """Bubble policy option. Repeatable."""
    events: tuple[NetEvent, ...] = ()
    """Network events during the run: the topology's, then the scenario's, then
    `--event`'s (testbed.experiments.inputs)."""
    on_failure: OnFailure = field(default="stop", metadata=setting(
        "--on-failure", commands=RUNS))
    """When a scenario's failure takes a worker: stop the run; restart from the last
    checkpoint (--checkpoint-every) on the same GPUs once the lost one is back; or replan
    on the GPUs still alive and go on from the last checkpoint."""
    checkpoint_every: int = field(default=0, metadata=setting(
        "--checkpoint-every", commands=RUNS, metavar="N", minimum=1, shown=""))
    """Checkpoint every N iterations: where --on-failure restart or replan goes on from
    (without it, from the start). Emulated, also at the end, into RUN_DIR/checkpoint
    (model and optimizer state with real compute; iteration count and measurements
    always), so that `up --resume` can go on after a crash. 0: never."""
    target_loss: float | None = field(default=None, metadata=setting(
        "--target-loss", commands=ALL, metavar="L",
        parse=parse_target_loss))
    """Report the time and tokens to loss L (time_to_loss in results.json): measured with
    real compute (the first step at or below L; a DiLoCo-family run's is its synchronized
    model's loss, evaluated at the start and after each cycle), else predicted by the
    loss model from the run's tokens/s; or that it was not reached. compare sorts by
    it."""
    loss_model: str = field(default=DEFAULT_LOSS_MODEL, metadata=setting(
        "--loss-model", commands=ALL, metavar="NAME"))
    """The loss model that predicts loss against tokens (results.json's loss_model, and
    the time to --target-loss where a run trains no model): the built-in one, every
    coefficient from a published source, or a fitted model installed under the
    entry-point group testbed.loss_models (see `testbed plugins`)."""
    trace: TraceChoice = field(default="summary", metadata=setting(
        "--trace", commands=RUNS))
    """trace.json.gz (Perfetto): summary draws every GPU up to 256 of them, past that one
    track per tensor-parallel group in as many whole replicas as fit in 256 (and says
    so); full draws every GPU; none writes no trace."""

    def __post_init__(self) -> None:
        if self.checkpoint_every < 0:
            raise InputError(f"must be 0 (never) or more, got {self.checkpoint_every}",
                             "--checkpoint-every")
        if self.target_loss is not None:
            check_target_loss(self.target_loss, "--target-loss")
        _choice(self.on_failure, OnFailure, "--on-failure")
        _choice(self.trace, TraceChoice, "--trace")


@dataclass(frozen=True)
class SimulatorSettings:
    """The simulator's part of a run."""

    profile: Profile | None = field(default=None, metadata=setting(
        "--profile", commands=("simulate", "sweep"), file=True, parse=parse_profile))
    """Per-stage compute times measured by a run (`testbed profile RUN_DIR`) instead of
    the FLOP model."""
    jitter: Jitter | None = field(default=None, metadata=setting(
        "--jitter", commands=("simulate", "compare", "sweep"), metavar="CV|KIND=CV,...",
        parse=parse_jitter_option))
    """Simulator noise: each compute, prefill and transfer delay, and each transfer's
    weight where it shares a link, times a lognormal factor of mean 1 and this coefficient
    of variation (one value for all, or compute=10%,prefill=10%,network=5%,share=10%),
    seeded by the job's seed (plus the repeat's number in compare). Default: none but
    the shares', at each connection's congestion control's spread (share=sawtooth:
    CUBIC 9.2%, Reno 19.2%, BBR 0); share=0 for equal shares."""


@dataclass(frozen=True)
class EmulatorSettings:
    """The emulator's part of a run."""

    compute: ComputeChoice = field(default="auto", metadata=setting(
        "--compute", commands=("up", "compare")))
    """real: torch forward/backward; emulated: each GPU is held busy for the modeled time
    while real-size tensors cross the network. auto: real when there is a GPU per
    worker."""
    shaper: ShaperChoice = field(default="auto", metadata=setting(
        "--shaper", commands=("up",)))
    """netem where the kernel has it, else the userspace delay line."""
    allreduce: AllReduceChoice = field(default="auto", metadata=setting(
        "--allreduce", commands=("up",)))
    """auto: with emulated compute, gradient all-reduces inside one DC are modeled at the
    DC's bandwidth (this machine cannot push intra-DC rates through Python); all-reduces
    across the WAN always move real bytes. real: always move real bytes."""
    stall_timeout_s: float = field(default=120.0, metadata=setting(
        "--stall-timeout", commands=("up",)))
    """Seconds in which no worker finishes an iteration before the run is declared hung
    (set it above an iteration's length)."""
    pacing: bool = field(default=True, metadata=setting(
        "--pacing", commands=("up", "compare"), parse=parse_on_off))
    """on: each cross-DC connection is paced at its share of the path's rate, as the
    simulator assumes (see docs/training.md, Pacing). off: unpaced bursts, to see what
    they cost."""
    activations: ActivationsChoice = field(default="auto", metadata=setting(
        "--activations", commands=("up", "compare")))
    """auto: with emulated compute, activations between stages in one DC are modeled at
    the DC's bandwidth, as the simulator moves them (this machine cannot push intra-DC
    rates through Python); across DCs they always move real bytes. real: always move real
    bytes."""
    dilation: int | Literal["auto"] = field(default=1, metadata=setting(
        "--dilation", commands=("up", "compare"), metavar="K|auto", parse=parse_dilation))
    """Run the emulation K times slower than the time it represents (link rates / K;
    latencies, compute, events and TCP's minimum RTO x K); every reported figure is in
    represented time. auto: the smallest K at which the plan's peak rate and its workers'
    CPU per action fit what this machine can give (both measured once, cached; see
    docs/training.md, Time dilation)."""
    wall_budget_s: float | None = None
    """Refuse, before anything starts, a run the simulator predicts would take longer
    than this of wall time at its dilation; None for no limit."""
    cluster: ClusterRun | None = None
    """Run across the machines of a cluster, coordinated from this one (`up --cluster`)."""

    def __post_init__(self) -> None:
        _choice(self.compute, ComputeChoice, "--compute")
        _choice(self.shaper, ShaperChoice, "--shaper")
        _choice(self.allreduce, AllReduceChoice, "--allreduce")
        _choice(self.activations, ActivationsChoice, "--activations")
        if self.dilation != "auto" and not 1 <= self.dilation <= MAX_DILATION:
            raise InputError(f"must be a whole number from 1 to {MAX_DILATION}, or auto "
                             f"(got {self.dilation!r})", "--dilation")
        if not self.stall_timeout_s > 0:
            raise InputError(f"must be above 0 seconds, got {self.stall_timeout_s}",
                             "--stall-timeout")
        if self.wall_budget_s is not None and not self.wall_budget_s > 0:
            raise InputError(f"must be above 0 seconds, got {self.wall_budget_s}",
                             "wall_budget_s")


def _choice(value: str, choice: object, flag: str) -> None:
    if value not in values_of(choice):
        raise InputError(f"must be one of {', '.join(values_of(choice))}, got {value!r}",
                         flag)


@dataclass(frozen=True)
class RunSpec:
    """Everything that decides a run; written with it so it can be run again. Built from
    settings by name with `build`, changed with `dataclasses.replace` (or `with_settings`,
    by name)."""

    backend: BackendName
    """Which runs it: the simulator or the emulator."""
    topology: Topology
    """The datacenters, their GPUs and the WAN, every override applied."""
    job: Job
    """The model, batches and iterations, every override applied."""
    common: Common = field(default_factory=Common)
    """What every run has."""
    scenario: Scenario = field(default_factory=Scenario)
    """Link traces, stragglers and failures during the run (its events are in
    `common.events`)."""
    simulate: SimulatorSettings = field(default_factory=SimulatorSettings)
    """The simulator's part: read by the simulator, and by the emulator's prediction."""
    emulate: EmulatorSettings = field(default_factory=EmulatorSettings)
    """The emulator's part."""

    @classmethod
    def build(cls, backend: BackendName, topology: Topology, job: Job,
              scenario: Scenario | None = None, **settings: Any) -> RunSpec:
        """A spec of `settings` by name (`policy="atlas"`, `dilation=4`); the rest their
        defaults."""
        spec = cls(backend, topology, job, scenario=scenario or Scenario())
        return spec.with_settings(**settings)

    def with_settings(self, **settings: Any) -> RunSpec:
        """The same spec with `settings`, by name, in place of its own."""
        named = run_settings()
        unknown = sorted(set(settings) - set(named))
        if unknown:
            raise TypeError(f"RunSpec has no setting {unknown[0]!r}")
        changed: dict[str, Any] = {}  # replace's keyword arguments: each section's type
        for section in SECTIONS:
            mine = {k: v for k, v in settings.items() if named[k].section == section}
            if mine:
                changed[section] = replace(getattr(self, section), **mine)
        return replace(self, **changed)

    def setting(self, name: str) -> Any:
        """A setting by name, from whichever section holds it."""
        return getattr(getattr(self, run_settings()[name].section), name)

    @property
    def policy(self) -> str:
        """The policy that plans the run; with `common.plan`, the one whose hooks run it
        and that labels it (testbed.policy.given)."""
        return self.common.policy

    @property
    def link_events(self) -> tuple[NetEvent, ...]:
        """What changes the links during the run: the scenario's traces beneath the
        events."""
        return self.scenario.link_events() + self.common.events


SECTIONS = ("common", "simulate", "emulate")
"""The sections of RunSpec whose fields are settings by name."""


@cache
def run_settings() -> dict[str, Named]:
    """Every setting of a run by name (testbed.run.settings)."""
    return settings_of(RunSpec, SECTIONS)
