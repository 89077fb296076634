"""A comparison's time to a target loss: measured from the runs' own losses (real compute)
or predicted by the loss model from their tokens/s (testbed.loss); with no target given,
the default one, the loss every-step data parallelism reaches at the job's token budget.
Beside it, effective tokens/s: tokens/s times the tokens every-step data parallelism needs
to reach the target over the method's."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from testbed.metrics.loss import duration_text
from testbed.report.run_figures import RunFigures


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


@dataclass
class ToLoss:
    """A row's time to the target loss over its repeats."""

    target: float
    time_s: float | None
    """The median over the repeats that reached it."""
    tokens: float | None
    reached: int
    not_reached: int
    why: str | None
    """Why the row has no time: each run's reason (not reached, or no loss measured)."""
    compute: str
    """How the runs computed: a modeled or emulated run measures no loss."""
    basis: str = "measured"
    """measured (the runs' losses) or predicted (the loss model)."""
    default: bool = False
    """The default target (no --target-loss given)."""
    fastest_s: float | None = None
    slowest_s: float | None = None
    """A predicted time's band (medians over repeats; None: never at that end)."""
    effective_tokens_per_s: float | None = None
    extrapolated: bool = False
    """The prediction goes beyond the loss model's sources."""
    model: str | None = None
    """The loss model that predicted it."""
    budget: int | None = None
    """The job's token budget (the default target is the synchronous loss there)."""

    def cell(self, unit: str = "") -> str:
        if self.reached == 0 and self.not_reached == 0:
            return "n/a (simulated)" if self.compute == "modeled" else f"n/a ({self.compute})"
        if self.time_s is None:
            return "not reached"
        missed = f" ({self.not_reached} not reached)" if self.not_reached else ""
        if self.basis == "predicted":
            return duration_text(self.time_s) + missed
        return f"{self.time_s:.3f}{unit}s{missed}"


def to_loss(ok: Sequence[RunFigures]) -> ToLoss | None:
    """The row's time to loss from its runs' results: their `time_to_loss` where a target
    was given, else the loss model's default target where every run has a prediction and
    none measured a loss; None otherwise."""
    blocks = [t for r in ok if (t := r.time_to_loss)]
    predictions = [p for r in ok if (p := r.loss_model)]
    ahead = [g for p in predictions if (g := p["target"])]
    common: dict[str, Any] = {  # ToLoss's keyword arguments, each its field's type
        "compute": ok[0].compute if ok else "modeled",
        "fastest_s": _median([t["time_band_s"][0] for t in ahead]),
        "slowest_s": _median([t["time_band_s"][1] for t in ahead]),
        "effective_tokens_per_s": _median([t["effective_tokens_per_s"] for t in ahead]),
        "extrapolated": any(t["extrapolated"] for t in ahead),
        "model": predictions[0]["name"] if predictions else None,
        "budget": predictions[0]["token_budget"] if predictions else None}
    if blocks:
        reached = [b for b in blocks if b["reached"]]
        basis = blocks[0].get("basis", "measured")
        if basis == "measured":
            common.update(fastest_s=None, slowest_s=None)
        return ToLoss(target=blocks[0]["target"],
                      time_s=_median([b["time_s"] for b in reached]),
                      tokens=_median([b["tokens"] for b in reached]), reached=len(reached),
                      not_reached=sum(b["reached"] is False for b in blocks),
                      why=next((b["reason"] for b in blocks if b["reason"]), None),
                      basis=basis, **common)
    if not ok or len(ahead) < len(ok) or any(r.measured_loss for r in ok):
        return None
    reached_at = [t for t in ahead if t["time_s"] is not None]
    return ToLoss(target=ahead[0]["loss"], time_s=_median([t["time_s"] for t in reached_at]),
                  tokens=_median([t["tokens"] for t in reached_at]), reached=len(reached_at),
                  not_reached=len(ahead) - len(reached_at),
                  why=next((t["reason"] for t in ahead if t["reason"]), None),
                  basis="predicted", default=True, **common)


def sort_key(time_s: float | None) -> tuple[bool, float]:
    """Rows by time to loss, those without one last (in their order)."""
    return (time_s is None, time_s or 0.0)


def loss_notes(losses: Sequence[tuple[str, ToLoss]], sorted_by_time: bool) -> list[str]:
    """What the time-to-loss and effective tokens/s columns are: the default target and
    where it comes from, that times are predicted and by which model, which rows
    extrapolate beyond its sources, and the order."""
    out: list[str] = []
    if not losses:
        return out
    first = losses[0][1]
    if first.default:
        out.append(f"time to loss {first.target:.4g}: no --target-loss given; the default "
                   "target is the loss every-step data parallelism reaches at the job's "
                   f"token budget ({first.budget or 0:.3g} tokens)")
    if any(t.basis == "predicted" for _, t in losses):
        out.append(f"times to loss predicted by the loss model {first.model!r} (testbed.loss) "
                   "at each run's tokens/s; effective tokens/s: tokens/s x the tokens "
                   "every-step data parallelism needs to reach the target over the method's")
        far = [combo for combo, t in losses if t.extrapolated]
        if far:
            out.append("extrapolated beyond the loss model's sources (wider band; "
                       f"loss_model.why_extrapolated in results.json): {', '.join(far)}")
    if sorted_by_time:
        out.append("rows sorted by time to loss; speed-ups against the first policy given")
    return out
