"""Messages without a training job around them, as the simulator moves them: the same flow
model and connection state a run's transfers get (testbed.sim.transfers). One message
alone across a WAN link, for figures that compare connection counts; long flows from
several DCs sharing their routes, for the shares they get; rounds of equal messages
from several hosts of one DC to another at once, as a pipeline's replicas send theirs."""

from __future__ import annotations

import functools
import itertools

from testbed.sim.agenda import Agenda
from testbed.sim.flows import Pair, pair_between
from testbed.sim.network import FluidNetwork
from testbed.topology.model import Topology


def one_transfer_s(topology: Topology, src_dc: str, dst_dc: str, nbytes: int,
                   connections: int, warm: bool) -> float:
    """Seconds from the first byte sent to the last received; `warm`: the connections'
    windows are already open (as between a training run's iterations with slow start
    after idle off), else they start from the initial window."""
    return one_transfer(topology, src_dc, dst_dc, nbytes, connections, warm)[0]


def one_transfer(topology: Topology, src_dc: str, dst_dc: str, nbytes: int,
                 connections: int, warm: bool) -> tuple[float, Pair]:
    """`one_transfer_s`, and the connections as the message left them (on a lossy path,
    each one's window and what it carried: Pair.cycles)."""
    agenda = Agenda()
    network = FluidNetwork({"wan": topology.bottleneck_bps(src_dc, dst_dc)}, agenda.at)
    latency = topology.one_way_latency(src_dc, dst_dc)
    pair = pair_between(topology, src_dc, dst_dc, connections, 2 * latency, nbytes,
                        topology.path_loss(src_dc, dst_dc))
    if warm:  # open, and just used: no restart after idle
        pair.cwnd, pair.last_active = pair.window, 0.0
    done: list[float] = []
    network.start(0.0, nbytes, ("wan",), pair, latency, done.append)
    agenda.run()
    return done[0], pair


def burst_rounds_s(topology: Topology, src_dc: str, dst_dc: str, flows: int, nbytes: int,
                   every_s: float, rounds: int) -> list[list[float]]:
    """`rounds` rounds, one every `every_s` from 0 on, of one message of `nbytes` from each
    of `flows` hosts of `src_dc` to a host of `dst_dc` apiece, over connections kept from
    round to round (each round after an idle, its window restarting as the topology's
    TCP says); per round, each message's seconds from its start to its arrival."""
    agenda = Agenda()
    network = FluidNetwork({"wan": topology.bottleneck_bps(src_dc, dst_dc)}, agenda.at)
    latency = topology.one_way_latency(src_dc, dst_dc)
    pairs = [pair_between(topology, src_dc, dst_dc, 1, 2 * latency, nbytes,
                          topology.path_loss(src_dc, dst_dc)) for _ in range(flows)]
    seconds = [[0.0] * flows for _ in range(rounds)]

    def arrived(k: int, i: int, t: float) -> None:
        seconds[k][i] = t - k * every_s

    def start(k: int, t: float) -> None:
        for i, pair in enumerate(pairs):
            network.start(t, nbytes, ("wan",), pair, latency, functools.partial(arrived, k, i))

    for k in range(rounds):
        agenda.at(k * every_s, functools.partial(start, k))
    agenda.run()
    return seconds


def shared_rates(topology: Topology, sources: list[str], dst_dc: str, from_s: float,
                 to_s: float, paced: bool | None = None) -> list[float]:
    """bit/s each of one connection from each source DC to `dst_dc` moves between `from_s`
    and `to_s`, every one sending from 0 on, sharing the WAN links of their routes;
    `paced` says whether they are paced, where not as the plan would pace them."""
    agenda = Agenda()
    capacity: dict[str, float] = {}
    network = FluidNetwork(capacity, agenda.at)
    endless = 1e15  # bytes: more than any run moves, and a float still counts single ones
    for src_dc in sources:
        hops = topology.path(src_dc, dst_dc)
        resources = tuple(f"wan:{a}>{b}" for a, b in itertools.pairwise(hops))
        for (a, b), resource in zip(itertools.pairwise(hops), resources, strict=True):
            capacity[resource] = topology.link(a, b).bandwidth_bps
        latency = topology.one_way_latency(src_dc, dst_dc)
        pair = pair_between(topology, src_dc, dst_dc, 1, 2 * latency, endless,
                            topology.path_loss(src_dc, dst_dc), paced)
        network.start(0.0, endless, resources, pair, latency, lambda _t: None)
    marks: list[dict[int, float]] = []
    agenda.at(from_s, lambda t: marks.append(network.remaining(t)))
    agenda.at(to_s, lambda t: marks.append(network.remaining(t)))
    agenda.stop_after = to_s
    agenda.run()
    first, last = marks
    return [(first[fid] - last[fid]) * 8 / (to_s - from_s) for fid in sorted(first)]
