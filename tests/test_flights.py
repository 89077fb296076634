"""A pair's bytes in flight (testbed.sim.flows.Pair.flights): a message's last round is
acknowledged a round trip after it opened, not as its last byte leaves, and a message
that starts before then, while the window still grows, may send only what the window
leaves beside those bytes until they are acknowledged (as two-dc's dp-compressed swaps
its gradients, an iteration apart that is shorter than the round trip)."""

from __future__ import annotations

import pytest

from testbed.plan.tcp_model import PAYLOAD_EFFICIENCY
from testbed.sim.agenda import Agenda
from testbed.sim.network import FluidNetwork, Pair

RTT = 0.04
RATE = 1e9 * PAYLOAD_EFFICIENCY
"""bit/s the link carries of a message's bytes."""
WINDOW = 100_000.0
"""The pair's window when the first message starts (bytes): in slow start, its buffers'
limit (4 MB) far above."""


def _sent(second_at: float, first: float = 50_000.0, second: float = 100_000.0
          ) -> tuple[float, float, Pair]:
    """When the last byte of each of two messages of one pair left, the second started at
    `second_at`."""
    agenda = Agenda()
    network = FluidNetwork({"wan": 1e9}, agenda.at)
    pair = Pair(1, 4e6, RTT, False)
    pair.cwnd = WINDOW
    ends: list[float] = []

    def start(now: float, nbytes: float) -> None:
        network.start(now, nbytes, ("wan",), pair, 0.0, lambda end: None,
                      on_sent=ends.append)

    agenda.at(0.0, lambda now: start(now, first))
    agenda.at(second_at, lambda now: start(now, second))
    agenda.run()
    return ends[0], ends[1], pair


def test_a_message_within_a_round_trip_waits_for_the_last_ones_tail() -> None:
    """The first message (50 KB) leaves at once; its bytes are acknowledged at one round
    trip (40 ms). The second (100 KB), started at 10 ms, finds 50 KB of its 100 KB window
    still in flight: half of it leaves at once, the rest as those are acknowledged, when
    the window has grown to 150 KB."""
    first, second, pair = _sent(0.01)
    assert first == pytest.approx(50_000 * 8 / RATE)
    assert second == pytest.approx(RTT + 50_000 * 8 / RATE)
    assert pair.cwnd == pytest.approx(WINDOW + 50_000)  # the first's tail acknowledged
    assert [at for at, _ in pair.flights] == pytest.approx([0.01 + RTT, 2 * RTT])
    assert [nbytes for _, nbytes in pair.flights] == pytest.approx([50_000, 50_000])


def test_a_message_a_round_trip_later_has_the_whole_grown_window() -> None:
    """Started after the first message's acknowledgements came back, the second sends in
    one flight of the window they grew: as the model did before it kept bytes in flight."""
    _, second, _ = _sent(0.05)
    assert second == pytest.approx(0.05 + 100_000 * 8 / RATE)


def test_the_tail_never_holds_back_more_than_the_window() -> None:
    """A tail as large as the window leaves the next message nothing until it is
    acknowledged: then the grown window (twice the first) takes it whole."""
    first, second, pair = _sent(0.001, first=WINDOW, second=WINDOW)
    assert first == pytest.approx(WINDOW * 8 / RATE)
    assert second == pytest.approx(RTT + WINDOW * 8 / RATE)
    assert not pair.flights or all(at > second for at, _ in pair.flights)


def test_a_message_its_share_paces_beside_a_tail_runs_in_plain_rounds() -> None:
    """A 200 MB message started beside a tail in flight, its window already past the
    link's bandwidth-delay product (5 MB): the link, not the window, sets its pace, so the
    tail holds nothing back and its rounds run without an event each (coasting), as a
    message with nothing in flight does. Kept in flight to the end, one round cut short
    by the next's acknowledgements at every round's end, it took an event per round."""
    def events(second_at: float) -> tuple[int, float]:
        agenda = Agenda()
        network = FluidNetwork({"wan": 1e9}, agenda.at)
        pair = Pair(1, 1e9, RTT, False)
        pair.cwnd = 8e6
        ends: list[float] = []

        def start(now: float, nbytes: float) -> None:
            network.start(now, nbytes, ("wan",), pair, 0.0, lambda end: None,
                          on_sent=ends.append)

        agenda.at(0.0, lambda now: start(now, 1e6))
        agenda.at(second_at, lambda now: start(now, 200e6))
        return agenda.run(), ends[1] - second_at

    beside, took = events(0.01)  # the first message's tail still in flight
    after, took_after = events(0.05)  # acknowledged before the second starts
    assert took == pytest.approx(took_after, rel=0.01)
    assert took == pytest.approx(200e6 * 8 / RATE, rel=0.01)
    assert beside <= after + 10
    assert after < 20  # against 40 rounds of 40 ms in the 1.6 s the message takes
