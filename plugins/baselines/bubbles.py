"""Baseline bubble policies: leave bubbles empty, or fill them greedily without prediction."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from testbed.policy.api import Bubble, BubblePolicy, Request


class NoFilling(BubblePolicy):
    name = "none"
    summary = "never fills bubbles (the training-only reference)"
    fills = False

    def admit(self, bubble: Bubble, queue: Sequence[Request], now: float,
              prefill_time: Callable[[int], float]) -> Request | None:
        return None


class GreedyFilling(BubblePolicy):
    name = "greedy"
    summary = "starts the oldest queued prefill whenever a GPU waits, with no prediction"

    def admit(self, bubble: Bubble, queue: Sequence[Request], now: float,
              prefill_time: Callable[[int], float]) -> Request | None:
        return min(queue, key=lambda r: (r.arrival, r.id)) if queue else None
