"""BubbleTea: inference prefill inside the training pipeline's bubbles, admitted only when
its predicted time (plus a guard) fits the bubble's predicted remainder."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from testbed.policy.api import Bubble, BubblePolicy, Option, Request, fraction, non_negative


class BubbleTeaPolicy(BubblePolicy):
    name = "bubbletea"
    summary = "prefill in predicted bubbles, only what fits (oldest request first)"
    options = (
        Option("guard", 0.1, "fraction of the predicted bubble kept free as a margin",
               fraction),
        Option("guard_s", 0.002, "seconds kept free at the end of every bubble", non_negative),
    )

    def admit(self, bubble: Bubble, queue: Sequence[Request], now: float,
              prefill_time: Callable[[int], float]) -> Request | None:
        room = (bubble.end - now) * (1 - self.settings["guard"]) - self.settings["guard_s"]
        for request in sorted(queue, key=lambda r: (r.arrival, r.id)):
            if prefill_time(request.prompt_len) <= room:
                return request
        return None
