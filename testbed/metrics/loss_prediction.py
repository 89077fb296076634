"""The loss model's prediction for one run: the loss its tokens reach, and the time to a
target loss at its tokens/s (the one given, or by default the loss every-step data
parallelism reaches at the job's token budget), with bands and whether it extrapolates.
Pure: the model, the method's effect and the run's figures in, results.json's
`loss_model` out."""

from __future__ import annotations

from typing import TypedDict

from testbed.job.model import Job
from testbed.loss.effects import LossEffect, Unmodelled
from testbed.loss.model import LossModel, effective_rate, predict, tokens_to


class TargetPrediction(TypedDict):
    """The time to a target loss at the run's tokens/s."""

    loss: float
    given: bool
    """True: the run's target (--target-loss); False: the default, the synchronous
    curve's loss at the job's token budget."""
    tokens: float | None
    """Tokens the method needs; None: never (`reason`)."""
    time_s: float | None
    time_band_s: tuple[float | None, float | None]
    """[fastest, slowest] at the band's two ends (None: never reached)."""
    effective_tokens_per_s: float | None
    """Tokens/s x the synchronous curve's tokens to the target over the method's."""
    reason: str | None
    extrapolated: bool
    """Whether reaching the target lies beyond the loss model's sources."""
    why_extrapolated: list[str]


class LossPrediction(TypedDict):
    """results.json's `loss_model`."""

    name: str
    sources: list[str]
    effect: str
    """The method's effect on loss per token, as its policy declares it."""
    params: int
    tokens: int
    """The run's tokens, which `predicted_loss_at_end` is at."""
    predicted_loss_at_end: float | None
    band: list[float] | None
    """[low, high] of the predicted loss."""
    penalty: float | None
    """The method's loss over every-step data parallelism's at the same tokens."""
    extrapolated: bool
    why_extrapolated: list[str]
    """Each setting outside the sources, one line."""
    token_budget: int
    target: TargetPrediction | None
    error: str | None
    """Why nothing is predicted (a plan the model has no form for)."""


def default_target(model: LossModel, job: Job) -> float:
    """The synchronous curve's loss at the job's token budget."""
    return model.synchronous(job.model.params, job.tokens_budgeted).loss


def loss_prediction(model: LossModel, effect: LossEffect, job: Job, tokens: int,
                    tokens_per_s: float | None, target: float | None) -> LossPrediction:
    params = job.model.params
    if isinstance(effect, Unmodelled):
        return LossPrediction(name=model.name, sources=list(model.sources),
                              effect=effect.describe(), params=params, tokens=tokens,
                              predicted_loss_at_end=None, band=None, penalty=None,
                              extrapolated=True, why_extrapolated=[],
                              token_budget=job.tokens_budgeted, target=None,
                              error=effect.reason)
    end = predict(model, effect, params, max(tokens, 1))
    goal = target if target is not None else default_target(model, job)
    reach = tokens_to(model, effect, params, goal)

    def seconds(count: float | None) -> float | None:
        return None if count is None or not tokens_per_s else count / tokens_per_s

    why = reach.reason if reach.tokens is None else \
        None if tokens_per_s else "the run measured no tokens/s"
    ahead = TargetPrediction(
        loss=goal, given=target is not None, tokens=reach.tokens, time_s=seconds(reach.tokens),
        time_band_s=(seconds(reach.fastest), seconds(reach.slowest)),
        effective_tokens_per_s=None if not tokens_per_s
        else effective_rate(model, effect, params, goal, tokens_per_s), reason=why,
        extrapolated=reach.extrapolated, why_extrapolated=list(reach.reasons))
    return LossPrediction(
        name=model.name, sources=list(model.sources), effect=effect.describe(), params=params,
        tokens=tokens, predicted_loss_at_end=end.loss, band=[end.low, end.high],
        penalty=model.penalty(effect, params).ratio,
        extrapolated=end.extrapolated or reach.extrapolated,
        why_extrapolated=list(dict.fromkeys((*end.reasons, *reach.reasons))),
        token_budget=job.tokens_budgeted, target=ahead, error=None)
