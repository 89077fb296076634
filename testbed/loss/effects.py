"""What a training method does to the loss a token buys, as the method declares it.

Three kinds: `Exact` (a schedule or a placement changes when a token is processed, never
what it teaches: every-step data parallelism, GPipe, 1F1B, torch's schedules, Atlas),
`LocalSteps` (the DiLoCo family: M workers step apart for H steps, then an outer step on
their averaged deltas, whole or a fragment at a time) and `CompressedGradients`
(every-step data parallelism whose gradients cross the WAN compressed). `Unmodelled` says
why a plan fits none of them: no loss is predicted for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

DENSE = ("fp32", "bf16", "fp16", "")
"""Payloads that carry every value at 16 bits or more ('' is the job's dtype)."""


@dataclass(frozen=True)
class Exact:
    """Every token teaches what it would under every-step data parallelism."""

    kind: Literal["exact"] = "exact"
    """Which of the effects this is (as results.json would name it)."""

    def describe(self) -> str:
        """One line, as results.json's loss_model.effect shows it."""
        return "exact (every-step data parallelism's loss per token)"


@dataclass(frozen=True)
class LocalSteps:
    """The DiLoCo family: `workers` groups (M) take `sync_every` (H) inner steps apart
    between two syncs of the same parameters; `fragments` > 1 syncs them a fragment at a
    time (Streaming DiLoCo), each sync landing `overlap` inner steps after it starts and
    mixed in with weight `mixing` for the local parameters."""

    workers: int
    """M: replica groups that step apart (a DiLoCo worker may itself be data parallel)."""
    sync_every: int
    """H: inner steps between two syncs of one fragment."""
    fragments: int = 1
    """Parts of the parameters synced in turn (1: all of them at once, DiLoCo)."""
    layers_per_fragment: float | None = None
    """Transformer layers in one fragment; None when the whole model syncs at once."""
    overlap: int = 0
    """Inner steps a sync runs behind (0: the workers wait for it)."""
    payload: str = "bf16"
    """What the deltas cross the WAN as: fp32, bf16, fp16, int8, int4, topP% ('' is the
    job's dtype)."""
    outer_lr: float = 0.7
    """The outer step's learning rate."""
    outer_momentum: float = 0.9
    """The outer step's momentum."""
    nesterov: bool = True
    """Nesterov momentum rather than heavy ball."""
    mixing: float = 0.0
    """The weight the local parameters keep when an overlapped sync lands."""
    kind: Literal["local-steps"] = "local-steps"
    """Which of the effects this is."""

    def __post_init__(self) -> None:
        if self.workers < 1 or self.sync_every < 1 or self.fragments < 1 or self.overlap < 0:
            raise ValueError(f"workers, sync_every and fragments must be at least 1 and "
                             f"overlap at least 0: {self}")

    @property
    def streaming(self) -> bool:
        """Whether fragments sync in turn (Streaming DiLoCo)."""
        return self.fragments > 1

    def describe(self) -> str:
        """One line, as results.json's loss_model.effect shows it."""
        what = "streaming DiLoCo" if self.streaming else "DiLoCo"
        parts = [f"M={self.workers}", f"H={self.sync_every}"]
        if self.streaming:
            parts.append(f"{self.fragments} fragments")
            parts.append(f"overlap {self.overlap}")
        parts.append(self.payload or "dtype")
        return f"{what} ({', '.join(parts)})"


@dataclass(frozen=True)
class CompressedGradients:
    """Every-step data parallelism whose gradients are compressed (with error feedback)."""

    payload: str
    """int8, int4 or topP% (a dense payload of 16 bits or more is exact)."""
    kind: Literal["compressed"] = "compressed"
    """Which of the effects this is."""

    def describe(self) -> str:
        """One line, as results.json's loss_model.effect shows it."""
        return f"compressed gradients ({self.payload}, error feedback)"


@dataclass(frozen=True)
class Unmodelled:
    """A plan the loss model has no form for (replicas that never sync, say)."""

    reason: str
    """Why, in one line."""
    kind: Literal["unmodelled"] = "unmodelled"
    """Which of the effects this is."""

    def describe(self) -> str:
        """One line, as results.json's loss_model.effect shows it."""
        return f"not modelled: {self.reason}"


LossEffect = Exact | LocalSteps | CompressedGradients | Unmodelled


def diloco(workers: int, sync_every: int, payload: str = "bf16") -> LocalSteps:
    """DiLoCo (arXiv 2311.08105) with its paper's outer step: Nesterov, lr 0.7, 0.9."""
    return LocalSteps(workers, sync_every, payload=payload)


def streaming_diloco(workers: int, sync_every: int, fragments: int,
                     layers_per_fragment: float, overlap: int = 1, payload: str = "bf16",
                     mixing: float = 0.5) -> LocalSteps:
    """Streaming DiLoCo (arXiv 2501.18512): fragments in turn, overlapped and mixed in."""
    return LocalSteps(workers, sync_every, fragments, layers_per_fragment, overlap, payload,
                      mixing=mixing)
