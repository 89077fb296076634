"""What a policy plugin implements. Policies are pure: no sockets, no awaits, no namespaces.

Both backends call the same hooks: `plan` once (with a PlanningContext), `next_transfer`
whenever an arbitrated WAN link direction falls free, `admit_batch` (by default `admit`)
whenever a GPU enters a predicted bubble. Plugins import all of this from `testbed.policy.api`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from testbed.errors import InputError, did_you_mean
from testbed.job.model import Job
from testbed.plan.model import Op, Plan
from testbed.policy.context import PlanningContext
from testbed.topology.model import Topology

API_VERSION = 1
"""The version of the policy interface (hooks, their arguments, `testbed.policy.api`).
It changes only when a plugin written for the previous one would break; the registry
refuses a plugin declaring another."""


@dataclass(frozen=True)
class Option:
    """A policy setting a user can pass as `-o name=value`."""

    name: str
    default: Any
    help: str
    parse: Callable[[str], Any] = str


@dataclass(frozen=True)
class Transfer:
    """One tensor waiting to cross a WAN link direction."""

    id: int
    src_gpu: str
    dst_gpu: str
    src_dc: str
    dst_dc: str
    kind: Op
    """SEND_F (activations) or SEND_B (gradients)."""
    replica: int
    stage: int
    """The sending stage."""
    microbatch: int
    nbytes: int
    ready_at: float
    """Seconds on the run's clock when the sender queued it."""
    iteration: int = 0


@dataclass(frozen=True)
class Request:
    """One inference prefill request."""

    id: int
    arrival: float
    prompt_len: int
    prefilled: int = 0
    """Prompt tokens already prefilled on the GPU being asked (a chunked prefill under
    way: their KV cache is there, so the rest can only run on that GPU); 0 if not started."""

    @property
    def remaining(self) -> int:
        return self.prompt_len - self.prefilled


@dataclass(frozen=True)
class Chunk:
    """Prompt tokens [start, end) of one request, to prefill now. `start` is the request's
    `prefilled`; a chunk that ends at `prompt_len` completes it (its KV cache then goes to
    the decode server)."""

    request: Request
    start: int
    end: int

    @property
    def tokens(self) -> int:
        return self.end - self.start

    @property
    def last(self) -> bool:
        return self.end == self.request.prompt_len


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
    start: float
    end: float

    @property
    def length(self) -> float:
        return self.end - self.start


class _Configurable:
    api_version: ClassVar[int] = API_VERSION
    """The policy API version this plugin is written for."""
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    options: ClassVar[tuple[Option, ...]] = ()
    fixed: ClassVar[dict[str, Any]] = {}
    """Settings a variant pins (an ablation switching a mechanism off): in `settings`,
    listed by `testbed plugins`, never taken as an option."""

    def __init__(self, **values: str) -> None:
        known = {option.name: option for option in self.options}
        self.settings: dict[str, Any] = {o.name: o.default for o in self.options}
        self.settings.update(self.fixed)
        for key, raw in values.items():
            if key not in known:
                names = ", ".join(known) or "none"
                raise InputError(f"unknown option {key!r} for {self.name}"
                                 f"{did_you_mean(key, known)}; options: {names}", "--option", key)
            try:
                self.settings[key] = known[key].parse(raw)
            except ValueError as exc:
                raise InputError(
                    f"bad value {raw!r} for {self.name}: {exc}", "--option", key
                ) from None


class TrainingPolicy(_Configurable, ABC):
    """Decides placement, schedule, connections and WAN sharing for a training job."""

    @abstractmethod
    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        """A Plan for this topology and job; raise InputError if the job cannot fit.
        `context` can simulate candidate plans and holds a cache shared across plans."""

    def next_transfer(
        self, plan: Plan, link: tuple[str, str], waiting: Sequence[Transfer]
    ) -> Transfer:
        """Which waiting transfer gets the arbitrated link direction next (first come first)."""
        return min(waiting, key=lambda t: (t.ready_at, t.id))


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
