"""The part of WAN transfers' spread that follows the connection, read from spans."""

from __future__ import annotations

import math
import random

import pytest

from testbed.common.spans import Span
from testbed.metrics.connection_spread import connection_spread


def _spans(effect: dict[str, float], scatter: float, iterations: int = 30,
           seed: int = 0) -> list[Span]:
    """Each connection's transfer of each step over one link: 1 s times its lasting
    factor and a fresh lognormal draw of `scatter`."""
    draw = random.Random(seed)
    spans: list[Span] = []
    for iteration in range(iterations):
        for microbatch in range(4):
            start = 100.0 * iteration + 10.0 * microbatch
            for i, (connection, factor) in enumerate(effect.items()):
                src, dst = connection.split(">")
                duration = factor * math.exp(draw.gauss(0.0, scatter))
                spans.append({"gpu": dst, "kind": "transfer", "start": start,
                              "end": start + duration, "iteration": iteration,
                              "stage": 1, "microbatch": microbatch, "link": "east>west",
                              "src": src, "dst": dst, "bytes": 1 << 20, "peer": src,
                              "action": i})
    return spans


def test_a_connection_that_stays_slow_is_measured() -> None:
    spread = connection_spread(_spans({"a>x": 1.0, "b>y": 1.0, "c>z": math.exp(0.3)},
                                      scatter=0.05))
    # the effects are -0.1, -0.1 and +0.2 about their mean: sd sqrt(0.03)
    assert spread == pytest.approx(math.sqrt(0.03), rel=0.05)


def test_scatter_drawn_anew_per_message_is_not_a_lasting_spread() -> None:
    spreads = [connection_spread(_spans({f"{k}>w{k}": 1.0 for k in range(4)}, scatter=0.2,
                                        seed=seed)) for seed in range(5)]
    assert all(s is not None and s < 0.04 for s in spreads)
    assert connection_spread(_spans({"a>x": 1.0, "b>y": 1.0}, scatter=0.0)) == 0.0


def test_the_first_iteration_and_lone_transfers_are_left_out() -> None:
    assert connection_spread(_spans({"a>x": 1.0, "b>y": 2.0}, 0.0, iterations=1)) is None
    assert connection_spread(_spans({"a>x": 1.0}, 0.0)) is None
    assert connection_spread([]) is None
