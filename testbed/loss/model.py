"""A loss model's interface, and what follows from any model that has it: the loss a
method reaches after some tokens, the tokens (and so the time) it needs to reach a loss,
and its effective tokens per second.

A model answers two questions: the synchronous curve (every-step data parallelism's loss
after D tokens for a model of N parameters) and a method's penalty on it (the ratio of
the method's loss to the synchronous one at the same tokens), each with a band and
whether it extrapolates beyond its sources. The built-in one is
testbed.loss.published.PublishedModel; a researcher's own fitted model implements
`LossModel` and is installed under the entry-point group `testbed.loss_models`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from testbed.loss.effects import Exact, LossEffect

MAX_TOKENS = 1e16
"""Tokens beyond which a target counts as out of reach (no run is a thousand times the
largest one trained)."""


@dataclass(frozen=True)
class Estimate:
    """A predicted loss, its band (low, high) and whether it extrapolates."""

    loss: float
    """The prediction (nats per token)."""
    low: float
    """The band's low end."""
    high: float
    """The band's high end."""
    extrapolated: bool
    """Whether the prediction goes beyond the sources (`reasons` say where)."""
    reasons: tuple[str, ...] = ()
    """What lies outside the sources, one line each (empty when nothing does)."""


@dataclass(frozen=True)
class Penalty:
    """A method's loss over the synchronous curve's at the same tokens and model size."""

    ratio: float
    """The method's loss over every-step data parallelism's (1: exact)."""
    low: float
    """The band's low end."""
    high: float
    """The band's high end."""
    extrapolated: bool
    """Whether the figure goes beyond the sources (`reasons` say where)."""
    reasons: tuple[str, ...] = ()
    """What lies outside the sources, one line each."""
    sources: tuple[str, ...] = ()
    """Keys of the sources the figure comes from (testbed.loss.sources)."""


EXACT = Penalty(1.0, 1.0, 1.0, False)


class LossModel(Protocol):
    """What `--loss-model NAME` loads: a class whose instances answer these."""

    @property
    def name(self) -> str:
        """What `--loss-model` calls it, and results.json's loss_model.name."""

    @property
    def sources(self) -> Sequence[str]:
        """One citation per source, as results.json's loss_model.sources lists them."""

    def synchronous(self, params: float, tokens: float) -> Estimate:
        """Every-step data parallelism's loss after `tokens` for `params` parameters."""

    def penalty(self, effect: LossEffect, params: float) -> Penalty:
        """`effect`'s loss over the synchronous one at the same tokens."""

    def floor(self, params: float) -> float:
        """The synchronous loss `params` parameters approach with unlimited tokens."""

    def irreducible(self) -> float:
        """The lowest loss any model size approaches: a target below it is refused."""


@dataclass(frozen=True)
class Reach:
    """The tokens a method needs to reach a loss: at the prediction and at its band's two
    ends (None: never reached)."""

    tokens: float | None
    fastest: float | None
    slowest: float | None
    reason: str | None = None
    """Why `tokens` is None."""
    extrapolated: bool = False
    reasons: tuple[str, ...] = field(default=())


def predict(model: LossModel, effect: LossEffect, params: float, tokens: float) -> Estimate:
    """The method's loss after `tokens`: the synchronous curve times its penalty, the
    bands multiplied."""
    base = model.synchronous(params, tokens)
    penalty = model.penalty(effect, params)
    return Estimate(base.loss * penalty.ratio, base.low * penalty.low,
                    base.high * penalty.high, base.extrapolated or penalty.extrapolated,
                    tuple(dict.fromkeys((*base.reasons, *penalty.reasons))))


def tokens_to(model: LossModel, effect: LossEffect, params: float, target: float) -> Reach:
    """The tokens at which the method's predicted loss (and its band's ends) fall to
    `target`; None where it never does."""
    penalty = model.penalty(effect, params)
    floor = model.floor(params)

    def solve(scale: float, side: str) -> float | None:
        return _tokens_for(lambda d: getattr(model.synchronous(params, d), side) * scale,
                           target)

    tokens = solve(penalty.ratio, "loss")
    reason = None
    if tokens is None:
        lowest = floor * penalty.ratio
        reason = (f"loss {target:g} is below the {lowest:.4g} this method approaches at "
                  f"{params:.3g} parameters with unlimited tokens"
                  if target <= lowest else f"needs more than {MAX_TOKENS:.0e} tokens")
    reached = None if tokens is None else model.synchronous(params, tokens)
    reasons = tuple(dict.fromkeys((*(reached.reasons if reached else ()), *penalty.reasons)))
    return Reach(tokens, solve(penalty.low, "low"), solve(penalty.high, "high"), reason,
                 penalty.extrapolated or bool(reached and reached.extrapolated), reasons)


def _tokens_for(curve: Callable[[float], float], target: float) -> float | None:
    """The tokens where a falling curve meets `target` (bisection in log tokens), None if
    not by MAX_TOKENS."""
    low, high = 1.0, MAX_TOKENS
    if curve(high) > target:
        return None
    if curve(low) <= target:
        return low
    for _ in range(200):
        middle = math.sqrt(low * high)
        if curve(middle) > target:
            low = middle
        else:
            high = middle
        if high / low < 1 + 1e-12:
            break
    return high


def effective_rate(model: LossModel, effect: LossEffect, params: float, target: float,
                   tokens_per_s: float) -> float | None:
    """Tokens/s times the synchronous curve's tokens to `target` over the method's: the
    rate at which every-step data parallelism would have to process tokens to reach the
    target as soon; None where either never reaches it."""
    mine = tokens_to(model, effect, params, target).tokens
    base = tokens_to(model, Exact(), params, target).tokens
    if mine is None or base is None:
        return None
    return tokens_per_s * base / mine

