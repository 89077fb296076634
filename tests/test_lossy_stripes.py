"""A lossy path's connections in the flow model, each with its own window: their first
losses where the order statistics of N exponential draws fall on average, and a message
dealt to them in pieces as the workers' transport deals it. Properties: every byte is
carried once; the connection that loses first carries the least; a clean path is one
window, as before."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.emulator.runtime.wire.protocol import chunks
from testbed.plan.striping import CHUNKS_AT_START, chunk_bytes
from testbed.sim.agenda import Agenda
from testbed.sim.flows import Pair, pair_between
from testbed.sim.loss_cycles import Stripes, first_losses
from testbed.sim.network import FluidNetwork
from testbed.sim.one_transfer import one_transfer, one_transfer_s
from testbed.topology import parse_topology
from testbed.topology.model import Topology


def _link(congestion: str, loss: float, rtt_ms: float = 50.0) -> Topology:
    return parse_topology({
        "tcp": {"congestion": congestion},
        "datacenters": [{"name": "east", "gpus": 1}, {"name": "west", "gpus": 1}],
        "wan": [{"between": ["east", "west"], "latency": f"{rtt_ms / 2:g}ms",
                 "bandwidth": "1Gbit", "loss": loss}]}, "link.yaml")


def test_one_connection_loses_first_after_one_over_loss_packets() -> None:
    """Alone, a connection's first loss is where every later one is: the periodic mean
    path the single-connection cases were measured against."""
    assert first_losses(1) == [1.0]


@pytest.mark.parametrize("connections", [2, 4, 16])
def test_first_losses_are_where_n_draws_fall_on_average(connections: int) -> None:
    """Against 20,000 draws of N exponential variates of mean 1, sorted: each order
    statistic's mean within 3%, and together they sum to N (the draws' own mean)."""
    rng = random.Random(7)
    draws = 20_000
    sums = [0.0] * connections
    for _ in range(draws):
        for k, value in enumerate(sorted(rng.expovariate(1.0) for _ in range(connections))):
            sums[k] += value
    expected = first_losses(connections)
    assert expected == sorted(expected)
    assert sum(expected) == pytest.approx(connections, rel=1e-12)
    for k in range(connections):
        assert sums[k] / draws == pytest.approx(expected[k], rel=0.03)


@settings(max_examples=40, deadline=None)
@given(congestion=st.sampled_from(["cubic", "bbr", "reno"]),
       loss=st.sampled_from([1e-4, 1e-3, 1e-2]),
       connections=st.sampled_from([2, 4, 16]),
       megabytes=st.sampled_from([0.2, 4.0, 20.0]))
def test_every_byte_of_a_lossy_message_is_carried_once(congestion: str, loss: float,
                                                       connections: int,
                                                       megabytes: float) -> None:
    size = int(megabytes * 1e6)
    _seconds, pair = one_transfer(_link(congestion, loss), "east", "west", size, connections,
                                  False)
    assert len(pair.cycles) == connections
    carried = sum(cycle.carried for cycle in pair.cycles)
    if pair.lossy:  # each connection's own window set every round: each byte is in one
        assert carried == pytest.approx(size, rel=1e-9)
    else:  # settled, or BBR's windows full: the rest went as one window
        assert carried <= size * (1 + 1e-9)
    assert pair.stripes is None  # the message is over: nothing held for it


def test_the_connection_that_loses_first_carries_the_least() -> None:
    """CUBIC at 0.1% over 16 connections: the first connection's loss comes after 1/16
    of 1,000 packets, in its third round, and it keeps the pieces it took; the others
    take the pieces left."""
    _seconds, pair = one_transfer(_link("cubic", 1e-3), "east", "west", 20_000_000, 16, False)
    carried = [cycle.carried for cycle in pair.cycles]
    assert min(carried) == carried[0] < 20e6 / 16 / 2
    assert max(carried) > 20e6 / 16
    assert pair.cycles[0].ssthresh == min(cycle.ssthresh for cycle in pair.cycles)


def test_a_message_waits_for_the_pieces_a_slow_connection_holds() -> None:
    """Dealt as the transport deals it, a message over 16 connections at 1% loss takes
    longer than the same windows would take pooled into one: the slowest connection's
    pieces hold its end up."""
    seconds, pair = one_transfer(_link("cubic", 1e-2), "east", "west", 4_000_000, 16, False)
    chunk = chunk_bytes(4_000_000, 16)
    assert min(cycle.carried for cycle in pair.cycles) >= CHUNKS_AT_START * chunk * (1 - 1e-9)
    assert seconds > one_transfer_s(_link("cubic", 0.0), "east", "west", 4_000_000, 16, False)


@pytest.mark.parametrize("connections", [1, 16])
def test_a_clean_path_keeps_one_window(connections: int) -> None:
    _seconds, pair = one_transfer(_link("cubic", 0.0), "east", "west", 20_000_000,
                                  connections, False)
    assert pair.cycles == [] and pair.stripes is None


def test_pieces_go_in_turn_to_the_connections_that_want_one() -> None:
    stripes = Stripes(10.0, [0.0, 0.0, 0.0])
    assert stripes.deal(25.0, lambda _i: True) == 0.0
    assert stripes.taken == [10.0, 10.0, 5.0]
    assert stripes.deal(15.0, lambda i: i == 1) == 5.0
    assert stripes.taken == [10.0, 20.0, 5.0]
    stripes.sends = [10.0, 10.0, 5.0]
    assert stripes.sent(12.5) == [5.0, 5.0, 2.5]  # half the round went out, of each
    assert stripes.taken == [5.0, 15.0, 2.5]


@pytest.mark.parametrize("total,connections", [(4_000_000, 16), (20_000_000, 4),
                                               (200_000_000, 1), (1000, 8)])
def test_the_transport_cuts_pieces_by_the_shared_rule(total: int, connections: int) -> None:
    pieces = chunks(total, connections)
    size = chunk_bytes(total, connections)
    assert all(length == size for _offset, length in pieces[:-1])
    assert 0 < pieces[-1][1] <= size


def test_a_striped_message_cut_by_an_outage_arrives_whole() -> None:
    """The link goes down under a lossy message over 16 connections and comes back with
    every window restarted (TCP timed out): what is left is dealt again and arrives, each
    byte carried once, later than without the outage by about the outage."""
    topology = _link("cubic", 1e-2)
    size = 4_000_000

    def arrival(outage: bool) -> tuple[float, Pair]:
        agenda = Agenda()
        network = FluidNetwork({"wan": 1e9}, agenda.at)
        pair = pair_between(topology, "east", "west", 16, 0.05, size, 1e-2)
        done: list[float] = []
        network.start(0.0, size, ("wan",), pair, 0.025, done.append)
        if outage:
            agenda.at(0.2, lambda t: network.set_capacity(t, "wan", 0.0))
            agenda.at(0.7, lambda t: network.set_capacity(t, "wan", 1e9))
            agenda.at(0.7, lambda t: network.restart_windows(t, "wan"))
        agenda.run()
        return done[0], pair

    clean, _pair = arrival(False)
    cut, pair = arrival(True)
    assert sum(cycle.carried for cycle in pair.cycles) == pytest.approx(size, rel=1e-9)
    assert cut >= clean + 0.5 * (1 - 1e-9)
