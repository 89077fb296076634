"""The requests waiting for a prefill, and the queue a bubble policy is offered. At hundreds
of requests per second the queue holds every request within the deadline, thousands, and
a policy asking at every bubble for the oldest prompt that fits would scan them all:
prompt lengths are kept in a min-tree over arrival order, so that question costs a
logarithm of the queue. Pure."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from typing import overload

from testbed.policy.base import Request, RequestQueue


class WaitingRequests:
    """Arrived, not started, not expired, in arrival order: requests join at the back,
    expire from the front and are taken from anywhere."""

    def __init__(self) -> None:
        self._slots: list[Request | None] = []
        """Every request that joined, in order; None once it left."""
        self._slot: dict[int, int] = {}
        """Waiting requests' slots, by id."""
        self._head = 0
        """No request waits in a slot before this."""
        self._leaves = 1
        self._tree: list[float] = [math.inf, math.inf]
        """Slot i's prompt length (inf once it left) at leaf `_leaves + i`; each inner
        node i the least of nodes 2i and 2i + 1."""

    def __len__(self) -> int:
        return len(self._slot)

    def __iter__(self) -> Iterator[Request]:
        slots = self._slots
        for slot in range(self._head, len(slots)):
            request = slots[slot]
            if request is not None:
                yield request

    def get(self, request_id: int) -> Request | None:
        slot = self._slot.get(request_id)
        return None if slot is None else self._slots[slot]

    def oldest(self) -> Request | None:
        while self._head < len(self._slots) and self._slots[self._head] is None:
            self._head += 1
        return self._slots[self._head] if self._head < len(self._slots) else None

    def append(self, request: Request) -> None:
        slot = len(self._slots)
        self._slots.append(request)
        self._slot[request.id] = slot
        if slot >= self._leaves:
            self._grow()
        else:
            self._set(slot, request.prompt_len)

    def remove(self, request_id: int) -> Request:
        slot = self._slot.pop(request_id)
        request = self._slots[slot]
        assert request is not None
        self._slots[slot] = None
        self._set(slot, math.inf)
        return request

    def first_at_most(self, tokens: int, after: Request | None = None) -> Request | None:
        """The oldest waiting request, of those after `after` (a waiting one) when given,
        whose prompt is at most `tokens` long."""
        node = self._leaves + (self._head if after is None else self._slot[after.id] + 1)
        tree = self._tree
        while node < len(tree):
            if tree[node] <= tokens:  # the leftmost leaf under it that fits
                while node < self._leaves:
                    node = 2 * node if tree[2 * node] <= tokens else 2 * node + 1
                return self._slots[node - self._leaves]
            while node & 1:  # on to the subtree just right of those looked at
                node >>= 1
            if node == 0:
                return None
            node += 1
        return None

    def _set(self, slot: int, value: float) -> None:
        node = self._leaves + slot
        tree = self._tree
        tree[node] = value
        while node > 1:
            left, right = tree[node & ~1], tree[node | 1]
            node >>= 1
            least = left if left <= right else right
            if tree[node] == least:
                break  # and so is every node above it
            tree[node] = least

    def _grow(self) -> None:
        """Twice the leaves (amortized: each slot is copied a constant number of times)."""
        while self._leaves <= len(self._slots):
            self._leaves *= 2
        leaves = [math.inf if r is None else float(r.prompt_len) for r in self._slots]
        tree = [math.inf] * (2 * self._leaves)
        tree[self._leaves:self._leaves + len(leaves)] = leaves
        for node in range(self._leaves - 1, 0, -1):
            tree[node] = min(tree[2 * node], tree[2 * node + 1])
        self._tree = tree


class OfferedQueue(RequestQueue):
    """What one bubble's policy is offered: the requests chunked on its GPU, then the
    waiting ones oldest first. A view, valid for the call it is passed to."""

    def __init__(self, mine: Sequence[Request], waiting: WaitingRequests) -> None:
        self._mine = tuple(mine)
        self._waiting = waiting
        self._copy: tuple[Request, ...] | None = None

    def __len__(self) -> int:
        return len(self._mine) + len(self._waiting)

    def __iter__(self) -> Iterator[Request]:
        return itertools.chain(self._mine, self._waiting)

    @overload
    def __getitem__(self, index: int) -> Request: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Request]: ...

    def __getitem__(self, index: int | slice) -> Request | Sequence[Request]:
        if self._copy is None:  # a policy that indexes pays for one copy
            self._copy = tuple(self)
        return self._copy[index]

    def first_at_most(self, tokens: int, after: Request | None = None) -> Request | None:
        if after is not None and self._waiting.get(after.id) != after:
            if after not in self._mine:
                raise ValueError(f"request {after.id} is not in the queue")
            after = None  # the waiting ones all come after those chunked here
        return self._waiting.first_at_most(tokens, after)
