"""BubbleTea's whole story at one set of conditions: as prefill requests arrive faster,
how busy the GPUs get, what share of the requests is served, how long their first token
takes, and what training pays. Atlas's plan, in the simulator, one run per rate."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import shared_cache
from testbed.figures.claims import Conditions, RunAsk
from testbed.figures.measure import Runner, Say
from testbed.metrics.summary import speedup

RATES = (10, 50, 100, 200, 400, 800)
"""Requests per second: from a load a dedicated GPU serves (10) to twice the claims'."""


@dataclass(frozen=True)
class LoadPoint:
    rate: int
    utilization_training: float | None
    utilization_total: float | None
    arrived: int | None
    served: int | None
    expired: int | None
    rejected: int | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    slowdown: float | None
    """Against Atlas without filling at the same rate, by tokens/s, in percent."""
    error: str | None = None

    @property
    def pending(self) -> int | None:
        """Arrived, neither served nor rejected when the run ended."""
        if self.arrived is None or self.served is None or self.rejected is None:
            return None
        return self.arrived - self.served - self.rejected

    @property
    def served_share(self) -> float | None:
        return self.served / self.arrived if self.arrived and self.served is not None else None


def load_curve(conditions: Conditions, say: Say, rates: Sequence[int] | None = None,
               bubbles: str = "bubbletea") -> list[LoadPoint]:
    """One simulated run per rate (default RATES), nothing written (the claims' own runs
    are)."""
    inputs = load_inputs(Path(conditions.topology))
    runner = Runner(inputs, "simulate", None, say)
    points = []
    iterations = f"iterations={conditions.bubble_iterations}"
    with shared_cache():
        # training alone does the same at any rate: one reference for every point
        alone = runner.figures(RunAsk("none", "atlas", sets=(iterations,)))
        reference = None if isinstance(alone, str) else alone.tokens_per_s
        for rate in RATES if rates is None else rates:
            sets = (f"inference.arrival_rate={rate}/s", iterations)
            say(f"load curve: {bubbles} at {rate} requests/s on {conditions.topology}")
            filled = runner.figures(RunAsk(f"{rate}", "atlas", bubbles=bubbles, sets=sets))
            if isinstance(filled, str):
                points.append(LoadPoint(rate, None, None, None, None, None, None, None, None,
                                        None, error=filled))
                continue
            ratio = speedup(reference, filled.tokens_per_s)
            r = filled.requests
            points.append(LoadPoint(
                rate, filled.utilization_training, filled.utilization_total,
                r.arrived if r else 0, r.served if r else 0, r.expired if r else 0,
                r.rejected if r else 0, r.ttft_p50_s if r else None,
                r.ttft_p99_s if r else None, None if ratio is None else 100 * (ratio - 1)))
    return points
