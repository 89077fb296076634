"""The control protocol as types: one dataclass per message, JSON on the wire.

Every message a coordinator, worker or decode server sends is one of these; `decode`
refuses an unknown operation or a field of the wrong type instead of guessing, so a
receiver can `match` on the class.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from testbed.common.choices import EmulatedCompute
from testbed.common.codec import DecodeError, JsonObject, build, to_json
from testbed.common.spans import Span
from testbed.emulator.runtime.wire.protocol import (
    MAX_CONTROL_BYTES,
    ProtocolError,
    read_message,
    send_message,
)
from testbed.job.model import DataFile, InnerOptimizer, ModelShape
from testbed.plan.model import OuterOptimizer
from testbed.scenario.slowdowns import Slowdown


@dataclass(frozen=True)
class Message:
    op: ClassVar[str] = ""
    wire_names: ClassVar[dict[str, str]] = {}
    """Fields whose key on the wire differs from their name (`bytes` is a builtin)."""
    by_op: ClassVar[dict[str, type[Message]]] = {}
    """Every message class by its operation, as each is defined (here or elsewhere:
    testbed.emulator.runtime.wire.join_messages)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        Message.by_op[cls.op] = cls


# --- worker or decode server to coordinator -------------------------------------------


@dataclass(frozen=True)
class Hello(Message):
    """First words on a control connection: who this is and the run's secret."""

    op = "hello"
    gpu: str
    token: str
    pid: int = 0
    role: str = "worker"


@dataclass(frozen=True)
class Listening(Message):
    op = "listening"
    port: int


@dataclass(frozen=True)
class Ready(Message):
    """Every data connection is open."""

    op = "ready"


@dataclass(frozen=True)
class IterationDone(Message):
    op = "iteration"
    iteration: int
    started: float
    ended: float
    loss: float | None
    spans: list[Span]
    lag_p99_s: float = 0.0


@dataclass(frozen=True)
class BubbleAsk(Message):
    """About to wait on a receive: is there a prefill to run meanwhile?"""

    op = "bubble"
    action: int
    iteration: int
    since: float


@dataclass(frozen=True)
class CheckpointWritten(Message):
    op = "checkpoint"
    done: int


@dataclass(frozen=True)
class WorkerError(Message):
    op = "error"
    message: str
    iteration: int | None = None
    spans: list[Span] = field(default_factory=list)


@dataclass(frozen=True)
class Done(Message):
    op = "done"
    synced_losses: dict[str, float] = field(default_factory=dict)
    """The synchronized model's loss by iteration (testbed.emulator.runtime.worker.synced_loss)."""


@dataclass(frozen=True)
class KvDelivered(Message):
    """A decode server received a request's whole KV cache."""

    op = "kv"
    wire_names = {"nbytes": "bytes"}
    request: int
    at: float
    nbytes: int = 0


# --- coordinator to worker ---------------------------------------------------------------


@dataclass(frozen=True)
class Outbound:
    address: str
    port: int
    connections: int


@dataclass(frozen=True)
class Connect(Message):
    """Whom to dial (by peer index), how many connections to expect, pacing per peer."""

    op = "connect"
    outbound: dict[str, Outbound]
    inbound: dict[str, int]
    pacing: dict[str, float]


@dataclass(frozen=True)
class Start(Message):
    op = "start"
    t0: float


@dataclass(frozen=True)
class Idle(Message):
    """No prefill for this bubble."""

    op = "idle"


@dataclass(frozen=True)
class PrefillPart:
    """Prompt tokens [start, end) of one request; the one that ends at `prompt_len` ships
    the request's KV cache (`kv_bytes`, all of it) to the decode server."""

    request: int
    prompt_len: int
    start: int
    end: int
    kv_bytes: int

    @property
    def last(self) -> bool:
        return self.end == self.prompt_len


@dataclass(frozen=True)
class Prefill(Message):
    """Prefill these parts in one pass (the bubble policy's batch)."""

    op = "prefill"
    parts: list[PrefillPart]
    modeled_s: float


@dataclass(frozen=True)
class Stop(Message):
    """The run is over: exit."""

    op = "stop"


@dataclass(frozen=True)
class Abort(Message):
    """The run failed: give up the iteration in progress and exit."""

    op = "abort"


# --- what a worker is told before it starts --------------------------------------------


@dataclass(frozen=True)
class PeerInfo:
    index: int
    gpu: str
    dc: str


@dataclass(frozen=True)
class EmulatedTiming:
    """Seconds an emulated GPU holds each compute step of one stage (testbed.plan.compute.
    StageCost: one cost model for both backends)."""

    forward_s: float
    backward_s: float
    input_s: float
    """A split backward's input-gradient half (I)."""
    weight_s: float
    """A split backward's weight-gradient half (W)."""
    step_s: float = 0.0


@dataclass(frozen=True)
class CollectiveSetup:
    """One collective this worker's stage joins: what moves and among whom."""

    wire_names = {"nbytes": "bytes"}
    stage: int
    """Whose gradients or deltas: a GPU holding several stages reduces each apart."""
    collective: str
    """Its text form (testbed.plan.collective.Collective; '' for every-step gradients)."""
    nbytes: int
    """What each member contributes (testbed.plan.compute.collective_bytes)."""
    group: list[PeerInfo]
    """The members in ring order, this worker included."""
    modeled_s: float | None = None
    """Seconds it takes when modeled instead of sent (inside one DC, emulated compute)."""


@dataclass(frozen=True)
class DecodeAddress:
    address: str
    port: int


@dataclass(frozen=True)
class Config(Message):
    """A worker's part of the plan, and how it computes and communicates."""

    op = "config"
    index: int
    gpu: str
    dc: str
    address: str
    """Where it listens for data connections."""
    replica: int
    stages: list[int]
    """The stages it holds, in order: one, or several (virtual stages)."""
    programs: list[list[str]]
    """This GPU's distinct iteration programs (testbed.plan.model.Plan.programs), each its
    ordered actions."""
    cycle: list[int]
    """The program each iteration of the plan's cycle runs here (iteration n: cycle[n %
    len(cycle)]); empty when the plan repeats one iteration."""
    neighbours: dict[str, PeerInfo]
    """By stage: the workers of this replica that hold the stages next to this GPU's, on
    other GPUs (a message between two of its own stages stays on the GPU)."""
    collectives: list[CollectiveSetup]
    """Every collective this GPU's programs join, of each stage it holds."""
    arbitrated: list[str]
    """WAN link directions (`src>dst`) whose pipeline transfers need a grant."""
    iterations: int
    compute: EmulatedCompute
    model: ModelShape
    layers: list[int]
    """Layers of every stage, in pipeline order."""
    seed: int
    dp: int
    microbatches: int
    microbatch_size: int
    activation_bytes: int
    emulated: dict[str, EmulatedTiming]
    """By stage, each stage it holds."""
    local_rank: int
    save_dir: str | None = None
    """Where to write the stage's final parameters (real compute)."""
    first_iteration: int = 0
    """Where a resumed run starts; its state comes from `restore_dir`."""
    restore_dir: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0
    stretch: int = 1
    """Real compute under dilation: the GPU stays busy this many times as long."""
    intra_dc_bps: float | None = None
    """Activations inside the DC are modeled at this rate (emulated compute)."""
    bubbles: bool = False
    decode: DecodeAddress | None = None
    inference_model: ModelShape | None = None
    data: DataFile | None = None
    """The corpus real compute trains on (None: the synthetic one); emulated compute
    has none."""
    optimizer: InnerOptimizer = field(default_factory=InnerOptimizer)
    """What real compute's optimizer steps take (the job's)."""
    outer: OuterOptimizer | None = None
    """What OUTER_STEP does, where the programs have one."""
    keeps_outer_model: bool = False
    """Every stage syncs deltas (testbed.plan.model.Plan.keeps_outer_model): real compute
    evaluates the synchronized model after training
    (testbed.emulator.runtime.worker.synced_loss)."""
    slowdowns: list[Slowdown] = field(default_factory=list)
    """When this GPU computes slower (a scenario's stragglers), in seconds from the
    start of training (`Start.t0`)."""
    opening: list[int] = field(default_factory=list)
    """As `cycle`, for the run's first cycle where it differs (Plan.opening)."""
    arbitrated_syncs: bool = False
    """All-reduce transfers across the WAN need a grant (Plan.sync_order)."""

    @property
    def stage(self) -> int:
        """Its first stage (what names it where one stage must: checkpoints, prefills)."""
        return self.stages[0]

    @property
    def pp(self) -> int:
        """Stages in the pipeline."""
        return len(self.layers)

    @property
    def period(self) -> int:
        """Iterations in one cycle of the plan."""
        return len(self.cycle) or 1

    def program_of(self, iteration: int) -> int:
        if iteration < len(self.opening):
            return self.opening[iteration]
        return self.cycle[iteration % len(self.cycle)] if self.cycle else 0


# --- encoding (testbed.common.codec) ---------------------------------------------------


def decode(data: JsonObject, *expected: type[Message]) -> Message:
    """The message `data` carries; ProtocolError if it is none of `expected` (any message
    when none are given) or a field is missing or of the wrong type."""
    cls = Message.by_op.get(str(data.get("op")))
    if cls is None or (expected and cls not in expected):
        wanted = " or ".join(c.op for c in expected) or "a message"
        raise ProtocolError(f"expected {wanted}, got {str(data.get('op'))[:40]!r}")
    try:
        message: Message = build(cls, data, cls.op)
    except DecodeError as exc:
        raise ProtocolError(str(exc)) from None
    return message


M = TypeVar("M", bound=Message)


def decode_as(data: JsonObject, cls: type[M]) -> M:
    """`data` as a `cls` message, or ProtocolError."""
    message = decode(data, cls)
    assert isinstance(message, cls)
    return message


async def send(writer: asyncio.StreamWriter, message: Message) -> None:
    await send_message(writer, to_json(message))


async def receive(reader: asyncio.StreamReader, *expected: type[Message]) -> Message:
    return decode(await read_message(reader), *expected)


async def receive_as(reader: asyncio.StreamReader, cls: type[M],
                     limit: int = MAX_CONTROL_BYTES) -> M:
    """The next message, which must be a `cls` (of at most `limit` bytes)."""
    return decode_as(await read_message(reader, limit), cls)
