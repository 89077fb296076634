"""BubbleTea: inference prefill inside the training pipeline's bubbles, admitted only when
its predicted time (plus a guard) fits the bubble's predicted remainder. With `learn` the
guard widens to cover how far recent predictions missed (a bubble shorter than predicted,
a prefill longer): fewer prefills overrun, at the cost of the ones it no longer admits."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Literal

from testbed.policy.api import (
    Bubble,
    BubblePolicy,
    Option,
    Request,
    fraction,
    non_negative,
    on_off,
)

MISSES = 200
"""Recent predictions the learned guard looks back on."""
COVER = 0.9
"""Share of those misses the learned guard covers."""


class BubbleTeaPolicy(BubblePolicy):
    name = "bubbletea"
    summary = "prefill in predicted bubbles, only what fits (oldest request first)"
    options = (
        Option("guard", 0.1, "fraction of the predicted bubble kept free as a margin (the "
               "least the learned guard keeps)", fraction),
        Option("guard_s", 0.002, "seconds kept free at the end of every bubble", non_negative),
        Option("learn", False, "widen the guard to cover 90% of recent prediction misses "
               "(on/off)", on_off),
    )

    def __init__(self, **values: str) -> None:
        super().__init__(**values)
        self.misses: dict[str, deque[float]] = {"bubble": deque(maxlen=MISSES),
                                                "prefill": deque(maxlen=MISSES)}

    def observe(self, kind: Literal["bubble", "prefill"], predicted: float,
                actual: float) -> None:
        if predicted <= 0:
            return
        # a bubble that came shorter, or a prefill that took longer, than predicted
        miss = (predicted - actual) / predicted if kind == "bubble" \
            else (actual - predicted) / predicted
        self.misses[kind].append(max(0.0, miss))

    def guard(self) -> float:
        """The share of a predicted bubble kept free: the configured one, or what covers
        recent misses of bubble and prefill predictions together, whichever is larger."""
        guard = float(self.settings["guard"])
        if not self.settings["learn"]:
            return guard
        bubble, prefill = (_quantile(self.misses[k], COVER) for k in ("bubble", "prefill"))
        # room = bubble x (1 - b) must hold prefill x (1 + p): keep 1 - (1 - b) / (1 + p)
        return max(guard, 1 - (1 - bubble) / (1 + prefill))

    def admit(self, bubble: Bubble, queue: Sequence[Request], now: float,
              prefill_time: Callable[[int], float]) -> Request | None:
        room = (bubble.end - now) * (1 - self.guard()) - self.settings["guard_s"]
        for request in sorted(queue, key=lambda r: (r.arrival, r.id)):
            if prefill_time(request.prompt_len) <= room:
                return request
        return None


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return min(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 0.99)
