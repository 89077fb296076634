"""BubbleTea: inference prefill inside the training pipeline's bubbles, admitted only when
its predicted time (plus a guard) fits the bubble's predicted remainder."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from testbed.policy.api import Bubble, BubblePolicy, Option, Request


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise ValueError("a fraction from 0 to 1")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError("must not be negative")
    return value


class BubbleTeaPolicy(BubblePolicy):
    name = "bubbletea"
    summary = "prefill in predicted bubbles, only what fits (oldest request first)"
    options = (
        Option("guard", 0.1, "fraction of the predicted bubble kept free as a margin",
               _fraction),
        Option("guard_s", 0.002, "seconds kept free at the end of every bubble", _seconds),
    )

    def admit(self, bubble: Bubble, queue: Sequence[Request], now: float,
              prefill_time: Callable[[int], float]) -> Request | None:
        room = (bubble.end - now) * (1 - self.settings["guard"]) - self.settings["guard_s"]
        for request in sorted(queue, key=lambda r: (r.arrival, r.id)):
            if prefill_time(request.prompt_len) <= room:
                return request
        return None
