"""BubbleTea: inference prefill inside the training pipeline's bubbles, admitted only when
its predicted time (plus a guard) fits the bubble's predicted remainder. With `learn` the
guard widens to cover how far recent predictions missed (a bubble shorter than predicted,
a prefill longer): fewer prefills overrun, at the cost of the ones it no longer admits.
Several prompts that fit go in one pass (`batch`), and what is left of a bubble takes a
chunk of the oldest prompt that does not fit whole (`chunk`): its KV cache stays on the
GPU and the next chunk runs in that GPU's next bubble, so prompts longer than any bubble
are served too (chunked prefill, which the paper leaves for future work)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from testbed.policy.api import (
    Bubble,
    BubblePolicy,
    Chunk,
    PrefillTimes,
    Request,
    at_least_one,
    first_at_most,
    fraction,
    non_negative,
    on_off,
    setting,
)

MISSES = 200
"""Recent predictions the learned guard looks back on."""
COVER = 0.9
"""Share of those misses the learned guard covers."""


@dataclass(frozen=True)
class BubbleTeaSettings:
    guard: float = setting(0.1, "fraction of the predicted bubble kept free as a margin (the "
                           "least the learned guard keeps)", fraction)
    guard_s: float = setting(0.002, "seconds kept free at the end of every bubble",
                             non_negative)
    learn: bool = setting(False, "widen the guard to cover 90% of recent prediction misses "
                          "(on/off)", on_off)
    batch: int = setting(1, "most prompts prefilled in one pass", at_least_one)
    chunk: bool = setting(True, "fill what is left of a bubble with a chunk of the oldest "
                          "prompt that does not fit whole (on/off)", on_off)
    min_chunk: int = setting(64, "fewest prompt tokens worth a chunk", at_least_one)


class BubbleTeaPolicy(BubblePolicy):
    name = "bubbletea"
    summary = "prefill in predicted bubbles, only what fits (oldest request first)"
    settings_type: ClassVar[type[Any]] = BubbleTeaSettings
    settings: BubbleTeaSettings

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
        guard = self.settings.guard
        if not self.settings.learn:
            return guard
        bubble, prefill = (_quantile(self.misses[k], COVER) for k in ("bubble", "prefill"))
        # room = bubble x (1 - b) must hold prefill x (1 + p): keep 1 - (1 - b) / (1 + p)
        return max(guard, 1 - (1 - bubble) / (1 + prefill))

    def room(self, bubble: Bubble, now: float) -> float:
        """Seconds of the predicted bubble a prefill may take."""
        return (bubble.end - now) * (1 - self.guard()) - self.settings.guard_s

    def admit(self, bubble: Bubble, queue: Sequence[Request], now: float,
              prefill_time: Callable[[int], float]) -> Request | None:
        room = self.room(bubble, now)
        for request in sorted(queue, key=lambda r: (r.arrival, r.id)):
            if prefill_time(request.prompt_len) <= room:
                return request
        return None

    def admit_batch(self, bubble: Bubble, queue: Sequence[Request], now: float,
                    prefill: PrefillTimes, max_tokens: int) -> Sequence[Chunk]:
        """Whole prompts that fit, in the queue's order (one chunked on this GPU first,
        then the oldest), up to `batch`; then, if room is left, a chunk of the first
        prompt left. Prefill time is taken to grow with a prompt's length, so one
        bisection per pick gives the longest new prompt that fits, and the oldest prompt
        no longer than that is the pick (`first_at_most`: no scan of the queue)."""
        room = self.room(bubble, now)
        if room <= 0:
            return ()
        chosen: list[Chunk] = []
        for request in queue:  # the one chunked on this GPU, if any, comes first
            if not request.prefilled:
                break
            whole = Chunk(request, request.prefilled, request.prompt_len)
            if _tokens(chosen) + whole.tokens <= max_tokens and \
                    prefill.batch([*chosen, whole]) <= room:
                chosen.append(whole)
        pick: Request | None = None
        while len(chosen) < self.settings.batch:
            probe = Request(-1, now, max_tokens)  # the longest new prompt that fits
            found = _largest_chunk(probe, chosen, room, max_tokens - _tokens(chosen), prefill)
            longest = found.end if found else 0
            pick = first_at_most(queue, longest, pick) if longest else None
            if pick is None:
                break
            chosen.append(Chunk(pick, 0, pick.prompt_len))
        if not self.settings.chunk or len(chosen) == self.settings.batch:
            return chosen
        taken = {c.request.id for c in chosen}
        oldest = next((r for r in queue if r.id not in taken), None)
        if oldest is None:
            return chosen  # one chunked here comes first: at most one is under way per GPU
        chunk = _largest_chunk(oldest, chosen, room, max_tokens - _tokens(chosen), prefill)
        worth = min(self.settings.min_chunk, oldest.remaining, max_tokens)
        if chunk is not None and chunk.tokens >= worth:
            chosen.append(chunk)
        return chosen


def _tokens(chunks: Sequence[Chunk]) -> int:
    return sum(c.tokens for c in chunks)


def _largest_chunk(request: Request, chosen: Sequence[Chunk], room: float, tokens: int,
                   prefill: PrefillTimes) -> Chunk | None:
    """The longest chunk of `request` from where it stands that, with `chosen`, fits in
    `room` seconds and `tokens` tokens (prefill time grows with the chunk: bisection)."""
    low, high = request.prefilled, min(request.prompt_len, request.prefilled + tokens)
    while low < high:
        middle = (low + high + 1) // 2
        if prefill.batch([*chosen, Chunk(request, request.prefilled, middle)]) <= room:
            low = middle
        else:
            high = middle - 1
    return Chunk(request, request.prefilled, low) if low > request.prefilled else None


def _quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return min(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 0.99)
