"""Fill a pipeline bubble with the shortest waiting prompt that fits in it: short prefills
fit more bubbles, so more requests are served inside training's idle time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from testbed.policy.api import Bubble, BubblePolicy, Request, non_negative, setting


@dataclass(frozen=True)
class ShortestFirstSettings:
    margin_s: float = setting(0.001, "seconds kept free at the end of every bubble",
                              non_negative)


class ShortestFirst(BubblePolicy):
    name = "shortest-first"
    summary = "the shortest queued prompt whose prefill fits what is left of the bubble"
    api_version = 2
    settings_type: ClassVar[type[Any]] = ShortestFirstSettings
    settings: ShortestFirstSettings

    def admit(self, bubble: Bubble, queue: Sequence[Request], now: float,
              prefill_time: Callable[[int], float]) -> Request | None:
        room = bubble.end - now - self.settings.margin_s
        fitting = [r for r in queue if prefill_time(r.prompt_len) <= room]
        return min(fitting, key=lambda r: (r.prompt_len, r.arrival, r.id), default=None)
