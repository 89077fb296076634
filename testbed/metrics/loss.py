"""Loss against time: every step's loss with the represented time and tokens at which it
ended, and the time to reach a target loss. Pure: the run's losses and iteration ends in,
typed records out.

Times are represented seconds since the run's start (an emulated run slowed K-fold by time
dilation reports wall / K, testbed.run.dilation), so curves from runs at different dilations,
and from different policies, share one axis.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Literal, NotRequired, TypedDict

from testbed.common.codec import Count, Seconds
from testbed.common.units import plural
from testbed.errors import InputError


class LossPoint(TypedDict):
    """One training step (iteration): its loss, and when it ended."""

    iteration: Count
    time_s: Seconds
    """Represented seconds from the run's start to the end of this step's optimizer step."""
    tokens: Count
    """Tokens processed up to and including this step."""
    loss: float | None
    """Mean over the replicas of the mean over microbatches (NaN: diverged; null in JSON,
    and so read back)."""


LossOf = Literal["training", "synchronized"]
"""Whose loss a time to loss ranks: the replicas' training steps' (each step's loss, mean
over the replicas), or the synchronized model's, a DiLoCo-family run's outer parameters
at the start of the run and of each cycle (testbed.emulator.runtime.worker.synced_loss), which is
the model such a run would keep; its replicas' local models, which step apart between
syncs, reach a lower loss sooner."""

Basis = Literal["measured", "predicted"]


class TimeToLoss(TypedDict):
    """How long a run took to reach `target`: the first step whose loss is at most it
    (measured), or the loss model's tokens to it at the run's tokens/s (predicted)."""

    target: float
    reached: bool | None
    """None: the run measured no loss at all (`reason` says why)."""
    iteration: Count | None
    """The step that reached it (measured only)."""
    time_s: Seconds | None
    tokens: Count | None
    reason: str | None
    """Why there is no time: not reached (and the lowest loss), or no loss measured."""
    loss_of: NotRequired[LossOf]
    """Whose loss is ranked (absent in results written before it was said)."""
    basis: Basis
    """measured: from the run's own losses (real compute); predicted: from the loss
    model (testbed.loss) where the run computes none."""


SIMULATED = ("the simulator trains no model: its loss is the loss model's prediction "
             "(real compute measures one: the emulator's --compute real)")
EMULATED = ("emulated compute trains no model: its loss is the loss model's prediction "
            "(--compute real measures one)")


def check_target_loss(target: float, where: str, given: object = None) -> float:
    """A target a loss can reach: a finite number above 0 (a cross-entropy is never
    below), else a located InputError quoting what was `given`."""
    if not math.isfinite(target) or target <= 0:
        shown = target if given is None else given
        raise InputError(f"must be a number above 0 (a cross-entropy loss), got {shown!r}",
                         where)
    return target


def no_loss_reason(compute: str) -> str | None:
    """Why a run in this compute mode has no loss to report; None when it has."""
    if compute == "real":
        return None
    return SIMULATED if compute == "modeled" else EMULATED


def loss_curve(losses: Mapping[int, float], ends_s: Sequence[float],
               tokens_per_iteration: int | Sequence[int]) -> list[LossPoint]:
    """The loss of every completed step (iteration `i` ended at `ends_s[i]`), in order;
    a loss reported for an iteration that did not complete on every GPU is left out.
    `tokens_per_iteration`: one figure, or each iteration's (a run replanned after a
    failure)."""
    so_far = _tokens_so_far(ends_s, tokens_per_iteration)
    return [LossPoint(iteration=i, time_s=end, tokens=so_far[i], loss=losses[i])
            for i, end in enumerate(ends_s) if i in losses]


def _tokens_so_far(ends_s: Sequence[float], tokens_per_iteration: int | Sequence[int]
                   ) -> list[int]:
    each = ([tokens_per_iteration] * len(ends_s) if isinstance(tokens_per_iteration, int)
            else list(tokens_per_iteration))
    return list(itertools.accumulate(each))


def synced_loss_curve(losses: Mapping[int, float], ends_s: Sequence[float],
                      tokens_per_iteration: int | Sequence[int]) -> list[LossPoint]:
    """The synchronized model's losses (testbed.emulator.runtime.worker.synced_loss) as a curve:
    the model kept as iteration `i` starts at iteration i's end, as a step's loss is
    (`loss_curve`); the model the run ends with, kept for the iteration after the last,
    at the run's end."""
    curve = loss_curve(losses, ends_s, tokens_per_iteration)
    last = len(ends_s)
    if last in losses and ends_s:
        curve.append(LossPoint(iteration=last, time_s=ends_s[-1],
                               tokens=_tokens_so_far(ends_s, tokens_per_iteration)[-1],
                               loss=losses[last]))
    return curve


def time_to_loss(curve: Sequence[LossPoint], target: float,
                 no_loss: str | None = None, loss_of: LossOf = "training") -> TimeToLoss:
    """The first step of `curve` whose loss is at most `target`; `no_loss`: why the run
    has no curve (the answer is then unknown, not "not reached"); `loss_of`: whose loss
    the curve holds."""
    if no_loss is not None:
        return TimeToLoss(target=target, reached=None, iteration=None, time_s=None,
                          tokens=None, reason=no_loss, loss_of=loss_of, basis="measured")
    for point in curve:
        loss = point["loss"]
        if loss is not None and loss <= target:  # NaN never is
            return TimeToLoss(target=target, reached=True, iteration=point["iteration"],
                              time_s=point["time_s"], tokens=point["tokens"], reason=None,
                              loss_of=loss_of, basis="measured")
    finite = [loss for p in curve if (loss := p["loss"]) is not None and math.isfinite(loss)]
    lowest = f"; lowest loss {min(finite):.4f}" if finite else ""
    where = f"by the synchronized model, evaluated {plural(len(curve), 'time')}" \
        if loss_of == "synchronized" else f"in {plural(len(curve), 'iteration')}"
    return TimeToLoss(target=target, reached=False, iteration=None, time_s=None, tokens=None,
                      reason=f"not reached {where}{lowest}", loss_of=loss_of,
                      basis="measured")


def predicted_time_to_loss(target: float, tokens: float | None, tokens_per_s: float | None,
                           reason: str | None, loss_of: LossOf = "training") -> TimeToLoss:
    """The loss model's tokens to `target` (None: never, `reason` says why) at the run's
    tokens/s (None: the run measured none); `loss_of`: the model whose loss it predicts
    (a DiLoCo-family run's synchronized one, as its sources evaluate it)."""
    if tokens is not None and not tokens_per_s:
        reason, tokens = "the run measured no tokens/s", None
    return TimeToLoss(target=target, reached=tokens is not None, iteration=None,
                      time_s=None if tokens is None or not tokens_per_s
                      else tokens / tokens_per_s,
                      tokens=None if tokens is None else round(tokens), reason=reason,
                      loss_of=loss_of, basis="predicted")


def time_to_loss_text(result: TimeToLoss) -> str:
    """One line for the console: the time and tokens, or why there are none."""
    if result["reached"] and result["time_s"] is not None:
        if result.get("basis") == "predicted":
            return (f"{duration_text(result['time_s'])}, {result['tokens'] or 0:.3g} tokens to "
                    f"loss {result['target']:g} (predicted by the loss model)")
        model = " (the synchronized model's)" if result.get("loss_of") == "synchronized" else ""
        return (f"{result['time_s']:.3f} s, {result['tokens']:,} tokens (iteration "
                f"{(result['iteration'] or 0) + 1}) to loss <= {result['target']:g}{model}")
    if result["reached"] is None:
        return f"n/a: {result['reason']}"
    if result.get("basis") == "predicted":
        return f"loss {result['target']:g} not reached (predicted): {result['reason']}"
    return f"loss <= {result['target']:g} {result['reason']}"


def duration_text(seconds: float) -> str:
    """A time a person takes in at a glance: seconds, minutes, hours, days or years."""
    for unit, size in (("years", 365.25 * 86400), ("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"
