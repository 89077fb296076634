"""What a policy plugin implements. Policies are pure: no sockets, no awaits, no namespaces.

Both backends call the same hooks: `plan` once (with a PlanningContext), `next_transfer`
whenever an arbitrated WAN link direction falls free, `admit_batch` (by default `admit`)
whenever a GPU enters a predicted bubble. Plugins import all of this from `testbed.policy.api`.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from testbed.errors import InputError, did_you_mean
from testbed.job.model import Job
from testbed.loss.effects import LossEffect
from testbed.plan.collective import Collective
from testbed.plan.model import Op, Plan, SyncOrder
from testbed.policy.context import PlanningContext
from testbed.policy.loss_effect import effect_of
from testbed.topology.model import Topology

API_VERSION = 2
"""The version of the policy interface (hooks, their arguments, `testbed.policy.api`).
It changes only when a plugin written for the previous one would break; the registry
refuses a plugin declaring another. 2: a policy's settings are a dataclass it declares
(`settings_type`, fields made with `setting`), no longer `options` and a dict."""

T = TypeVar("T")


def setting(default: T, help: str, parse: Callable[[str], T]) -> T:
    """A field of a policy's settings dataclass that a user sets as `-o name=value`: its
    default, one line of help, and the parser of its text (a ValueError says what is
    wrong)."""
    value: T = field(default=default, metadata={"help": help, "parse": parse})
    return value


@dataclass(frozen=True)
class NoSettings:
    """The settings of a policy that has none."""


@dataclass(frozen=True)
class Option:
    """A policy setting a user can pass as `-o name=value` (a field of its settings)."""

    name: str
    """What `-o` names: the settings field's name."""
    default: Any
    """The value when the option is not given."""
    help: str
    """One line, as `testbed plugins` lists it."""
    parse: Callable[[str], Any] = str
    """Turns the option's text into the value; raises ValueError with the reason."""


def options_of(settings_type: type[Any], fixed: Mapping[str, Any]) -> tuple[Option, ...]:
    """The options of a settings dataclass: its fields but those `fixed` pins."""
    out = []
    for f in fields(settings_type):
        if f.name in fixed:
            continue
        if "parse" not in f.metadata or f.default is MISSING:
            raise TypeError(f"{settings_type.__name__}.{f.name}: make it with setting("
                            "default, help, parse)")
        out.append(Option(f.name, f.default, f.metadata["help"], f.metadata["parse"]))
    unknown = set(fixed) - {f.name for f in fields(settings_type)}
    if unknown:
        raise TypeError(f"fixed names no setting of {settings_type.__name__}: "
                        f"{', '.join(sorted(unknown))}")
    return tuple(out)


@dataclass(frozen=True)
class Transfer:
    """One tensor waiting to cross a WAN link direction."""

    id: int
    """Unique within a run."""
    src_gpu: str
    """The sending GPU."""
    dst_gpu: str
    """The receiving GPU."""
    src_dc: str
    """The sender's datacenter."""
    dst_dc: str
    """The receiver's datacenter."""
    kind: Op
    """SEND_F (activations), SEND_B (gradients) or ALLREDUCE (a chunk of an all-reduce's
    ring, where the plan arbitrates its syncs: Plan.sync_sharing)."""
    replica: int
    """The sending stage's replica."""
    stage: int
    """The sending stage."""
    microbatch: int
    """The microbatch it carries."""
    nbytes: int
    """Its size in bytes."""
    ready_at: float
    """Seconds on the run's clock when the sender queued it."""
    iteration: int = 0
    """The training iteration it belongs to."""
    collective: Collective | None = None
    """For an ALLREDUCE chunk: what its all-reduce reduces (fragment, bucket, payload)."""


def first_layers_first(waiting: Sequence[Transfer]) -> Transfer:
    """The transfer whose values the next forward needs first: pipeline traffic before any
    sync, then the earliest stage, the first fragment (Streaming DiLoCo's fragment k holds
    blocks k, k + N, ...) and the last bucket (bucket 0 holds the last layers: the order
    torch's DDP fills them), then first come. The order the Streaming DiLoCo paper's
    simulation implies at 99% compute utilization: the first layers' syncs first."""
    def key(t: Transfer) -> tuple[int, int, int, int, float, int]:
        c = t.collective
        if c is None:
            return (0, 0, 0, 0, t.ready_at, t.id)
        return (1, t.stage, c.fragment, -c.bucket, t.ready_at, t.id)

    return min(waiting, key=key)


@dataclass(frozen=True)
class Request:
    """One inference prefill request."""

    id: int
    """Unique within a run."""
    arrival: float
    """Seconds on the run's clock when it arrived (compare with `now` for its wait)."""
    prompt_len: int
    """Prompt tokens to prefill."""
    prefilled: int = 0
    """Prompt tokens already prefilled on the GPU being asked (a chunked prefill under
    way: their KV cache is there, so the rest can only run on that GPU); 0 if not started."""

    @property
    def remaining(self) -> int:
        """Prompt tokens not yet prefilled."""
        return self.prompt_len - self.prefilled


@dataclass(frozen=True)
class Chunk:
    """Prompt tokens [start, end) of one request, to prefill now. `start` is the request's
    `prefilled`; a chunk that ends at `prompt_len` completes it (its KV cache then goes to
    the decode server)."""

    request: Request
    """The request it belongs to."""
    start: int
    """First prompt token of the chunk: the request's `prefilled`."""
    end: int
    """One past the chunk's last prompt token."""

    @property
    def tokens(self) -> int:
        """end - start."""
        return self.end - self.start

    @property
    def last(self) -> bool:
        """Whether this chunk completes the request's prompt."""
        return self.end == self.request.prompt_len


class RequestQueue(Sequence[Request], ABC):
    """The queue a bubble policy is offered (the broker's, valid for one call): a sequence,
    which also answers `first_at_most` without a scan. Use `first_at_most(queue, ...)`,
    which takes any sequence."""

    @abstractmethod
    def first_at_most(self, tokens: int, after: Request | None = None) -> Request | None:
        """See the function `first_at_most`."""


def first_at_most(queue: Sequence[Request], tokens: int, after: Request | None = None
                  ) -> Request | None:
    """The first request of `queue` not started (`prefilled` 0), of those after `after`
    when given, whose prompt is at most `tokens` long; None if none is. On the queue the
    broker offers, a logarithm of its length (it runs to thousands); on any other
    sequence, a scan."""
    if isinstance(queue, RequestQueue):
        return queue.first_at_most(tokens, after)
    start = 0 if after is None else queue.index(after) + 1
    return next((r for r in itertools.islice(queue, start, None)
                 if not r.prefilled and r.prompt_len <= tokens), None)


class PrefillTimes(Protocol):
    """Predicted prefill times (seconds), learnt from measured prefills as they come."""

    def __call__(self, prompt_len: int) -> float:
        """A whole prompt prefilled alone."""

    def chunk(self, start: int, end: int) -> float:
        """Tokens [start, end) of one prompt, prefilled alone."""

    def batch(self, chunks: Sequence[Chunk]) -> float:
        """Several chunks (or whole prompts) prefilled in one pass."""


@dataclass(frozen=True)
class Bubble:
    """A predicted idle window on one GPU, on the run's clock."""

    gpu: str
    """The idle GPU's name (`east-0`)."""
    start: float
    """Seconds on the run's clock when the window opens."""
    end: float
    """Seconds on the run's clock when training is predicted to need the GPU again."""

    @property
    def length(self) -> float:
        """end - start, seconds."""
        return self.end - self.start


class _Configurable:
    api_version: ClassVar[int] = API_VERSION
    """The policy API version this plugin is written for."""
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    settings_type: ClassVar[type[Any]] = NoSettings
    """The policy's settings: a frozen dataclass whose fields are made with `setting`.
    A policy also annotates `settings` with it, so its hooks read typed fields."""
    fixed: ClassVar[dict[str, Any]] = {}
    """Settings a variant pins (an ablation switching a mechanism off): in `settings`,
    listed by `testbed plugins`, never taken as an option. Keyword arguments of
    `settings_type`, each value its own field's type (which the plugin declares)."""
    options: ClassVar[tuple[Option, ...]] = ()
    """What `-o` takes: made from `settings_type` and `fixed`, never declared."""
    settings: Any
    """This policy's settings_type, with the defaults, `fixed` and the options given."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.api_version == API_VERSION:  # the registry refuses the others, by name
            cls.options = options_of(cls.settings_type, cls.fixed)

    def __init__(self, **values: str) -> None:
        known = {option.name: option for option in self.options}
        chosen: dict[str, Any] = dict(self.fixed)  # settings_type's keyword arguments
        for key, raw in values.items():
            if key not in known:
                names = ", ".join(known) or "none"
                raise InputError(f"unknown option {key!r} for {self.name}"
                                 f"{did_you_mean(key, known)}; options: {names}", "--option", key)
            try:
                chosen[key] = known[key].parse(raw)
            except ValueError as exc:
                raise InputError(
                    f"bad value {raw!r} for {self.name}: {exc}", "--option", key
                ) from None
        self.settings = self.settings_type(**chosen)


class TrainingPolicy(_Configurable, ABC):
    """Decides placement, schedule, connections and WAN sharing for a training job."""

    @abstractmethod
    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        """A Plan for this topology and job; raise InputError if the job cannot fit.
        `context` can simulate candidate plans and holds a cache shared across plans."""

    def next_transfer(
        self, plan: Plan, link: tuple[str, str], waiting: Sequence[Transfer]
    ) -> Transfer:
        """Which waiting transfer gets the arbitrated link direction next: first come
        first, or the first layers first where the plan orders its syncs so
        (Plan.sync_order)."""
        if plan.sync_order is SyncOrder.FIRST_LAYERS:
            return first_layers_first(waiting)
        return min(waiting, key=lambda t: (t.ready_at, t.id))

    def loss_effect(self, plan: Plan, topology: Topology) -> LossEffect:
        """What this policy's plan does to the loss a token buys, for the loss model's
        prediction of its loss and time to a target loss: `Exact()` (a schedule or a
        placement), `LocalSteps(M, H, ...)` (the DiLoCo family) or
        `CompressedGradients(payload)`. The default reads it from the plan (whole dense
        gradients every step: exact; outer steps: the DiLoCo family, with the plan's M, H,
        fragments, overlap, payload and outer optimizer); a policy whose plan means
        something else says so here."""
        return effect_of(plan, topology)


class BubblePolicy(_Configurable, ABC):
    """Decides which inference prefill, if any, runs in a GPU's idle window."""

    fills: ClassVar[bool] = True
    """Whether this policy ever runs a prefill. One that never does (the training-only
    reference) keeps no room for the inference model on the training GPUs, and the broker
    refuses a prefill it admits all the same."""

    @abstractmethod
    def admit(
        self,
        bubble: Bubble,
        queue: Sequence[Request],
        now: float,
        prefill_time: Callable[[int], float],
    ) -> Request | None:
        """A queued request to start now on `bubble.gpu`, or None to leave the GPU idle."""

    def admit_batch(self, bubble: Bubble, queue: Sequence[Request], now: float,
                    prefill: PrefillTimes, max_tokens: int) -> Sequence[Chunk]:
        """What to prefill now on `bubble.gpu`, as one pass: whole requests, or chunks of
        them (each from its `prefilled` on), at most `max_tokens` prompt tokens together
        and each request once; empty to leave the GPU idle. `queue` holds requests not
        started and those chunked on this GPU. The default runs the one request `admit`
        picks among those not started and within `max_tokens`, whole."""
        fresh = [r for r in queue if r.prefilled == 0 and r.prompt_len <= max_tokens]
        request = self.admit(bubble, fresh, now, prefill) if fresh else None
        return () if request is None else (Chunk(request, 0, request.prompt_len),)

    def observe(self, kind: Literal["bubble", "prefill"], predicted: float,
                actual: float) -> None:
        """What a prediction `admit` could have relied on turned out to be: a bubble's
        length at a receive, or a prefill's time. For policies that learn; the default
        ignores it."""


def parse_options(pairs: Sequence[str]) -> Mapping[str, str]:
    """`key=value` strings from the command line."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise InputError(f"expected KEY=VALUE, got {pair!r}", "--option")
        out[key.strip()] = value.strip()
    return out
