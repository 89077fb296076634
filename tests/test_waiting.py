"""The waiting requests' min-tree answers as a scan of the queue does."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.inference.waiting import OfferedQueue, WaitingRequests
from testbed.policy.api import Request, first_at_most

Op = tuple[str, int, int]
ops = st.lists(st.tuples(st.sampled_from(["join", "join", "take", "expire", "ask"]),
                         st.integers(0, 10**6), st.integers(1, 5000)), max_size=80)


def _scan(waiting: list[Request], tokens: int, after: Request | None) -> Request | None:
    start = 0 if after is None else waiting.index(after) + 1
    return next((r for r in waiting[start:] if r.prompt_len <= tokens), None)


@given(ops)
def test_the_oldest_that_fits_is_the_one_a_scan_finds(steps: list[Op]) -> None:
    store, model = WaitingRequests(), []
    for n, (what, pick, tokens) in enumerate(steps):
        if what == "join":
            request = Request(n, float(n), tokens)
            store.append(request)
            model.append(request)
        elif what == "take" and model:
            taken = model.pop(pick % len(model))
            assert store.remove(taken.id) == taken
        elif what == "expire" and model:
            assert store.oldest() == model[0]
            store.remove(model.pop(0).id)
        else:
            after = model[pick % len(model)] if model and pick % 3 else None
            assert store.first_at_most(tokens, after) == _scan(model, tokens, after)
        assert list(store) == model and len(store) == len(model)
        assert store.oldest() == (model[0] if model else None)
    for request in model:
        assert store.get(request.id) == request


@given(st.lists(st.integers(1, 5000), max_size=30), st.integers(0, 2), st.integers(1, 5000),
       st.integers(0, 40))
def test_the_offered_queue_is_the_sequence_it_stands_for(
        lengths: list[int], chunked: int, tokens: int, after: int) -> None:
    """As a policy sees it: the requests chunked on its GPU first, then the waiting ones;
    `first_at_most` gives the same on it as on a plain list of the same requests."""
    store = WaitingRequests()
    waiting = [Request(i, float(i), n) for i, n in enumerate(lengths)]
    for request in waiting:
        store.append(request)
    mine = [Request(100 + i, -1.0, 6000, prefilled=10) for i in range(chunked)]
    queue = OfferedQueue(mine, store)
    plain = [*mine, *waiting]
    assert list(queue) == plain and len(queue) == len(plain)
    assert [queue[i] for i in range(len(plain))] == plain and queue[1:3] == tuple(plain[1:3])
    start = plain[after % len(plain)] if plain and after < 30 else None
    assert first_at_most(queue, tokens, start) == first_at_most(plain, tokens, start)
    with pytest.raises(ValueError, match="not in the queue"):
        first_at_most(queue, tokens, Request(-5, 0.0, 10))
    if waiting:  # a request the queue holds under another state is not the one asked after
        with pytest.raises(ValueError):
            first_at_most(queue, tokens, replace(waiting[0], prefilled=1))
