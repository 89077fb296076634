"""results.json as types: the record every run writes, whichever backend ran it. The
dataclasses here are the contract; results.schema.json beside this module is generated
from them (`python -m testbed.report.results_schema`, checked by a test) and is what users
validate saved results against (`testbed results validate`).

Blocks whose inner shape belongs to another part of testbed (the plan, memory, a failure's
record, a scenario, the emulator's health) have TypedDicts that testbed's readers read
them through, marked OPEN (testbed.common.codec): the schema leaves them open objects, as
they were before they had types, so results written by earlier versions still validate;
the rest is closed: a key the types do not know is refused. `SCHEMA_VERSION` changes whenever a
file written by this version would not validate against the previous schema, or the
reverse."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal, NotRequired, TypedDict, cast

from testbed.common.choices import (
    ActivationsChoice,
    AllReduceChoice,
    BackendName,
    Compute,
    OnFailure,
    Status,
    TraceChoice,
)
from testbed.common.codec import (
    OMITTED,
    OPEN,
    Count,
    JsonObject,
    NonNegative,
    Positive,
    Seconds,
    to_json,
)
from testbed.metrics.lockstep import LockstepCounts
from testbed.metrics.loss import LossPoint, TimeToLoss
from testbed.metrics.loss_prediction import LossPrediction
from testbed.metrics.overruns import OverrunCounts
from testbed.plan.compute import GpuMemory
from testbed.plan.model import PlanRecord, PlanSummary
from testbed.plan.queue_mismatch import QueueMismatch
from testbed.scenario.scenario import ScenarioRecord
from testbed.topology.net_events import EventEntry
from testbed.topology.seats import ClusterRecord

SCHEMA_VERSION = 3
"""1: results.json before it had a schema (a `schema` key); 2: the first with one; 3:
`loss_model` (the loss model's prediction) and `time_to_loss.basis`; within 3, `jitter`'s
`share` may be null (each pair's congestion control's own spread), `emulation` may hold
`path_share`, a simulated run may have `lockstep`, and a run `queue_mismatches`: widenings
that every file written before still meets."""


class EmulationHealth(TypedDict):
    """Whether the machine kept the emulator's pace
    (testbed.emulator.runtime.coordinator.health.Health)."""

    cpu_bound: bool
    cpu_busy: float
    workers_cpu: float | None
    lag_p99_s: float | None
    delay_line_late_mean_s: float | None
    delay_line_late_max_s: float | None
    reasons: list[str]
    dilation: int
    suggested_dilation: int
    needed_dilation: int
    span_cpu_s: float | None
    path_share: NotRequired[float | None]
    """The share of its busiest worker's time its own actions' CPU took; absent from
    runs recorded before it was measured."""


class WanConnection(TypedDict):
    """A host's TCP connection to a host of another DC as training ended, one per sending
    side: in an emulated run as its kernel held it (`ss -tin`:
    testbed.emulator.net.tcp_state), in a simulated one as the model did
    (testbed.sim.pair_states). Real TCP keeps the slow-start threshold its losses (or
    CUBIC's HyStart) set for the rest of a connection's life, and every slow start after
    an idle stops there; the simulator models only the thresholds a full queue's losses and
    a path's random loss set (HyStart's it does not)."""

    host: str
    peer: str
    congestion: str
    min_rtt_s: float | None
    """Its smallest round trip, in represented time (a dilated run's, divided by K); the
    simulator's: the links' alone."""
    cwnd_segments: int
    ssthresh_segments: int | None
    """None: it never left slow start."""
    retransmitted_segments: int | None
    """Segments it sent again over its life; None: not counted (the simulator)."""
    bytes_sent: int | None
    """None: not counted (the simulator)."""
    connections: NotRequired[int]
    """Connections this row stands for, alike (the simulator's striped ones on a clean
    path share one window); 1 where absent."""


class PredictedMemory(TypedDict):
    """What the emulator predicted its run would hold, before it started."""

    total_bytes: int
    workers_bytes: int
    payloads_bytes: int
    network_bytes: int
    coordinator_bytes: int
    connections_bytes: int


class MeasuredMemory(TypedDict):
    """The emulator's `memory` block: the peaks measured (absent where none were), beside
    the prediction."""

    workers_peak_bytes: NotRequired[int]
    largest_worker: NotRequired[str | None]
    largest_worker_bytes: NotRequired[int]
    coordinator_peak_bytes: NotRequired[int]
    predicted: PredictedMemory
    available_bytes: int | None


SimulatedMemory = dict[str, GpuMemory]
"""The simulator's `memory` block: per GPU of replica 0 (testbed.plan.compute)."""


class FailureResult(TypedDict):
    """One failure of a scenario's, and what it cost (testbed.run.recovery)."""

    worker: str
    at_s: float
    back_s: float | None
    action: OnFailure
    completed: int
    resumed_from: int
    checkpoint_s: float
    detected_s: float
    resumed_s: float | None
    """None: the run stopped."""
    lost_work_s: float
    time_lost_s: float | None
    plan_before: PlanRecord
    plan_after: PlanRecord | None


@dataclass(frozen=True)
class IterationTimes:
    """Seconds per training iteration: the measured ones (the first, warm-up, left out)."""

    median: Seconds | None
    min: Seconds | None
    max: Seconds | None
    mean: Seconds | None
    all: list[Seconds]
    """Every iteration's, the first included."""


@dataclass(frozen=True)
class CycleTimes:
    """A plan whose iterations differ repeats every `period` of them: the mean over
    whole cycles."""

    mean: Seconds | None
    period: Positive
    cycles: Count


@dataclass(frozen=True)
class TokenCounts:
    measured: Count
    """Tokens of the measured iterations."""
    total: Count
    measured_s: Seconds | None
    """Seconds the measured iterations took."""


@dataclass(frozen=True)
class GpuUtilization:
    training: NonNegative | None
    total: NonNegative | None
    """Training and inference prefills."""


@dataclass(frozen=True)
class WanUse:
    bytes: Count
    utilization: NonNegative | None


@dataclass(frozen=True)
class Ttft:
    """Time to first token (seconds) over served requests."""

    p50: Seconds | None
    p99: Seconds | None
    mean: Seconds | None = field(default=None, metadata=OMITTED)


@dataclass(frozen=True)
class Dedicated:
    """The reference: the same requests on GPUs of their own."""

    gpus: Positive
    ttft_s: Ttft


@dataclass(frozen=True)
class Inference:
    """Inference requests served in training's bubbles (all zero when none arrived)."""

    requests: Count
    served: Count
    expired: Count
    rejected: Count
    ttft_s: Ttft
    served_share: NonNegative | None = field(default=None, metadata=OMITTED)
    pending: Count | None = field(default=None, metadata=OMITTED)
    chunked: Count | None = field(default=None, metadata=OMITTED)
    batched_passes: Count | None = field(default=None, metadata=OMITTED)
    kv_bytes: Count | None = field(default=None, metadata=OMITTED)
    policy: str | None = field(default=None, metadata=OMITTED)
    """The bubble policy."""
    dedicated: Dedicated | None = field(default=None, metadata=OMITTED)
    overruns: Annotated[OverrunCounts, OPEN] | None = field(default=None, metadata=OMITTED)
    """Emulator: how often prefills held training past their bubbles."""


@dataclass(frozen=True)
class Versions:
    testbed: str
    torch: str
    python: str
    kernel: str


@dataclass(frozen=True)
class TraceInfo:
    detail: TraceChoice
    left_out: str | None
    """What trace.json.gz leaves out, in one line."""


@dataclass(frozen=True)
class SimulatorBlock:
    """What the simulator alone writes into results.json: each field is the `Results` field
    of the same name (a test holds them to it)."""

    profile: bool
    """Compute times came from a measured profile (`--profile`), not the FLOP model."""
    jitter: dict[str, float | None] | None
    """The seeded noise on compute, prefill, transfer delays and shares
    (testbed.plan.jitter; share None: each pair's congestion control's own spread)."""
    lockstep: LockstepCounts | None = None
    """How many WAN transfers that shared a link ran in step with another
    (testbed.metrics.lockstep): equal shares hold them so, real TCP does not."""
    pacing: Literal["assumed"] = "assumed"
    """The simulator assumes paced connections."""
    wan_connections: list[Annotated[WanConnection, OPEN]] | None = None
    """A run to its end: its WAN pairs' connections then, by host and peer."""


@dataclass(frozen=True)
class EmulatorBlock:
    """What the emulator alone writes into results.json: each field is the `Results` field
    of the same name (a test holds them to it)."""

    allreduce: AllReduceChoice
    pacing: bool
    activations: ActivationsChoice
    dilation: Positive
    """The dilation the run went at (testbed.run.dilation)."""
    dilation_requested: Positive | Literal["auto"]
    checkpoint_every: Positive | None
    cluster: Annotated[ClusterRecord, OPEN] | None
    """The machines of a run across several (testbed.topology.seats.describe_run)."""
    resumed_at: list[Count]
    """The iterations the run was resumed after (`up --resume`)."""
    predicted_iteration_s: Seconds | None
    """The simulator's iteration time for the same plan."""
    prediction_error: float | None
    """The emulator's against it (positive: the emulator was slower)."""
    emulation: Annotated[EmulationHealth, OPEN] | None
    """Whether the machine kept the pace (testbed.emulator.runtime.coordinator.health)."""
    memory: Annotated[MeasuredMemory, OPEN]
    """The run's peak memory as measured, beside what was predicted (in place of the
    plan's memory summary)."""
    wan_connections: list[Annotated[WanConnection, OPEN]]
    """Its hosts' TCP connections to other DCs as training ended, by host and peer."""


@dataclass(frozen=True)
class RecoveryBlock:
    """A run with a scenario's failures: each one, and the time they cost."""

    on_failure: OnFailure
    failures: list[Annotated[FailureResult, OPEN]]
    time_lost_s: Seconds


BackendBlock = SimulatorBlock | EmulatorBlock
"""What one backend alone writes into results.json."""


@dataclass(frozen=True)
class Results:
    """One run's results.json."""

    schema_version: int
    backend: BackendName
    policy: str
    bubble_policy: str | None
    topology: str
    shaper: str | None
    """The emulator's link shaper (netem or userspace); null in the simulator."""
    compute: Compute
    iterations: Count
    iterations_requested: Positive
    iteration_time_s: IterationTimes
    cycle_time_s: CycleTimes
    tokens_per_s: NonNegative | None
    goodput_tokens_per_s: NonNegative | None
    tokens: TokenCounts
    gpu_utilization: GpuUtilization
    wan: WanUse
    training_slowdown: float | None
    inference: Inference
    plan: Annotated[PlanSummary, OPEN]
    plan_file: str | None
    memory: Annotated[SimulatedMemory | MeasuredMemory, OPEN]
    """The simulator's per GPU, or the emulator's measured (`measured_memory`)."""
    seed: Count
    status: Status
    error: str | None
    loss: dict[str, float | None]
    """Loss by iteration (null: diverged)."""
    loss_curve: list[LossPoint] | None
    """Each step's training loss, mean over the replicas (for a DiLoCo-family run, of
    their local models, which step apart between syncs)."""
    loss_note: str | None
    """Why the run has no loss (its compute measured none)."""
    time_to_loss: TimeToLoss | None
    loss_model: LossPrediction | None
    """The loss model's prediction (testbed.loss): the loss at the run's tokens, the time
    to the target at its tokens/s; null for a run made without one."""
    policy_options: dict[str, str]
    tcp: dict[str, dict[str, str]]
    versions: Versions
    wall_s: Seconds | None
    trace: TraceInfo
    events: list[Annotated[EventEntry, OPEN]] = field(default_factory=list)
    """Each network event as a topology's `events` entry, with `applied`: whether it
    began before training ended (testbed.scenario.reach)."""
    scenario: Annotated[ScenarioRecord, OPEN] | None = None
    """The scenario file's traces, stragglers and failures, each with `applied` (a trace
    also with `steps_applied`), and its recovery."""
    pacing: bool | Literal["assumed"] = True
    """The emulator's --pacing; the simulator assumes paced connections."""
    queue_mismatches: list[QueueMismatch] | None = field(default=None, metadata=OMITTED)
    """Where the plan's loss-based flows cross a WAN queue too shallow for their round trip
    (testbed.plan.queue_mismatch): the simulator's figure misses what such a queue does to
    real TCP; absent where none does."""
    # the simulator's
    profile: bool | None = field(default=None, metadata=OMITTED)
    jitter: dict[str, float | None] | None = field(default=None, metadata=OMITTED)
    lockstep: LockstepCounts | None = field(default=None, metadata=OMITTED)
    # the emulator's
    allreduce: AllReduceChoice | None = field(default=None, metadata=OMITTED)
    activations: ActivationsChoice | None = field(default=None, metadata=OMITTED)
    dilation: Positive | None = field(default=None, metadata=OMITTED)
    dilation_requested: Positive | Literal["auto"] | None = field(default=None,
                                                                  metadata=OMITTED)
    checkpoint_every: Positive | None = field(default=None, metadata=OMITTED)
    cluster: Annotated[ClusterRecord, OPEN] | None = field(default=None, metadata=OMITTED)
    resumed_at: list[Count] | None = field(default=None, metadata=OMITTED)
    predicted_iteration_s: Seconds | None = field(default=None, metadata=OMITTED)
    prediction_error: float | None = field(default=None, metadata=OMITTED)
    emulation: Annotated[EmulationHealth, OPEN] | None = field(default=None,
                                                              metadata=OMITTED)
    wan_connections: list[Annotated[WanConnection, OPEN]] | None = field(default=None,
                                                                         metadata=OMITTED)
    # a run with a scenario's failures
    on_failure: OnFailure | None = field(default=None, metadata=OMITTED)
    failures: list[Annotated[FailureResult, OPEN]] | None = field(default=None,
                                                                   metadata=OMITTED)
    time_lost_s: Seconds | None = field(default=None, metadata=OMITTED)
    # a DiLoCo-family run with real compute
    synced_loss_curve: list[LossPoint] | None = field(default=None, metadata=OMITTED)
    """The synchronized model's loss at the start of the run and of each cycle, on that
    iteration's global batch, and of the model it ends with, at its end
    (testbed.emulator.runtime.worker.synced_loss): what its `time_to_loss` ranks."""

    def document(self) -> JsonObject:
        """results.json as written: the JSON document, for code that reads JSON (and
        results.json as read, which may predate these types, is that too)."""
        out: JsonObject = to_json(self)
        return out

    @property
    def typical_s(self) -> Seconds | None:
        """The run's typical iteration: the median, or for a plan whose iterations differ
        the mean over its whole cycles (a median would be a step without the cycle's
        sync)."""
        times = self.iteration_time_s
        return times.mean if self.cycle_time_s.period > 1 else times.median

    @property
    def measured_memory(self) -> MeasuredMemory | None:
        """The emulator's measured `memory` block; None for the simulator's."""
        if self.backend != "emulate" or "predicted" not in self.memory:
            return None
        return cast(MeasuredMemory, self.memory)  # the emulator's block replaces the plan's
