"""The WAN links as network events leave them: the capacities the flow model shares and
the queues its flows may keep standing, the latency each new transfer sees, and outages
that stop a link until TCP's backoff notices it is back."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable

from testbed.sim.network import RTO_MIN, FluidNetwork, Schedule
from testbed.sim.queues import StandingQueues
from testbed.sim.workers import SimWorker
from testbed.topology.model import Topology
from testbed.topology.net_events import Change


def link_key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


def resume_after_outage(outage_s: float, rto_s: float) -> float:
    """When TCP sends again after a link was down `outage_s`: retransmissions back off,
    doubling from one RTO, so the first one after the link is back comes at the next
    point of rto x (2^k - 1)."""
    waited, step = 0.0, rto_s
    while waited < outage_s:
        waited += step
        step *= 2
    return waited


def capacities(topology: Topology, workers: Iterable[SimWorker]) -> dict[str, float]:
    """Every resource a flow can cross: each WAN direction, each worker's NIC both ways
    (a tensor-parallel group has one NIC per GPU), each DC's decode server's downlink."""
    capacity: dict[str, float] = {}
    for link in topology.links:
        capacity[f"wan:{link.a}>{link.b}"] = link.bandwidth_bps
        capacity[f"wan:{link.b}>{link.a}"] = link.bandwidth_bps
    for worker in workers:
        nic = topology.dc(worker.dc).bandwidth_bps * len(worker.gpus)
        capacity[f"up:{worker.lead}"] = nic
        capacity[f"down:{worker.lead}"] = nic
    for dc in topology.datacenters:
        capacity[f"down:decode-{dc.name}"] = dc.bandwidth_bps
    return capacity


def queues(topology: Topology) -> StandingQueues:
    """The standing queues of each WAN direction's drop-tail queue."""
    return StandingQueues({f"wan:{a}>{b}": float(link.effective_queue_bytes)
                           for link in topology.links
                           for a, b in ((link.a, link.b), (link.b, link.a))})


class Links:
    def __init__(self, topology: Topology, network: FluidNetwork, at: Schedule) -> None:
        self.topology, self.network, self.at = topology, network, at
        directions = [d for link in topology.links for d in ((link.a, link.b), (link.b, link.a))]
        self.latency = {d: topology.link(*d).latency_s for d in directions}
        """One-way delay per direction (src DC, dst DC)."""
        self.bandwidth = {d: topology.link(*d).bandwidth_bps for d in directions}
        self.loss = {link_key(link.a, link.b): link.loss for link in topology.links}
        self.down_since: dict[tuple[str, str], float] = {}
        self.returning: set[tuple[str, str]] = set()
        """Links down whose return is scheduled (both directions may say the outage
        ended, a one-way trace's loss on one of them)."""
        self._routes: dict[tuple[str, str], list[tuple[str, str]]] = {}
        """The directions of each DC pair's route, found once (every send asks)."""

    def one_way(self, src_dc: str, dst_dc: str) -> float:
        """Propagation delay along the route set up at the start, with event changes."""
        return sum(self.latency[direction] for direction in self._route(src_dc, dst_dc))

    def _route(self, src_dc: str, dst_dc: str) -> list[tuple[str, str]]:
        route = self._routes.get((src_dc, dst_dc))
        if route is None:
            hops = self.topology.path(src_dc, dst_dc)
            route = self._routes[(src_dc, dst_dc)] = list(itertools.pairwise(hops))
        return route

    def path_loss(self, src_dc: str, dst_dc: str) -> float:
        """The share of packets lost along the route as events leave its links (a link
        that is down counts as lossless: its outage stops the flows instead)."""
        kept = 1.0
        for a, b in self._route(src_dc, dst_dc):
            loss = self.loss[link_key(a, b)]
            kept *= 1.0 - (loss if loss < 1.0 else 0.0)
        return 1.0 - kept

    def apply(self, change: Change, now: float) -> None:
        """A network event: latency for transfers that start from now on, bandwidth at
        once (of one direction, or both), an outage stops the link and TCP resumes after
        its retransmission backoff. Loss below an outage reaches each pair's next message
        (Transfers.pair: its congestion control's answer to loss, testbed.sim.flows)."""
        key = link_key(change.a, change.b)
        directions = [(change.a, change.b)] if change.one_way else [(change.a, change.b),
                                                                    (change.b, change.a)]
        for direction in directions:
            if change.latency_s is not None:
                self.latency[direction] = change.latency_s
            if change.bandwidth_bps is not None:
                self.bandwidth[direction] = change.bandwidth_bps
                if key not in self.down_since:
                    self.network.set_capacity(now, _resource(direction), change.bandwidth_bps)
        if change.loss is None:
            return
        self.loss[key] = change.loss
        both = [(change.a, change.b), (change.b, change.a)]
        if change.loss >= 1.0 and key not in self.down_since:  # the link goes down
            self.down_since[key] = now
            for direction in both:
                self.network.set_capacity(now, _resource(direction), 0.0)
        elif change.loss < 1.0 and key in self.down_since and key not in self.returning:
            self.returning.add(key)  # and comes back
            outage = now - self.down_since[key]
            rtt = self.latency[both[0]] + self.latency[both[1]]
            rto = (self.topology.tcp_for(key[0]).rto_min_s or RTO_MIN) + rtt
            back = self.down_since[key] + resume_after_outage(outage, rto)
            self.at(back, functools.partial(self._back, key, both))

    def _back(self, key: tuple[str, str], directions: list[tuple[str, str]],
              now: float) -> None:
        self.returning.discard(key)
        if self.loss[key] >= 1.0:
            return  # down again before TCP came back: the next restore brings it back
        self.down_since.pop(key, None)
        for direction in directions:
            self.network.set_capacity(now, _resource(direction), self.bandwidth[direction])
            self.network.restart_windows(now, _resource(direction))


def _resource(direction: tuple[str, str]) -> str:
    return f"wan:{direction[0]}>{direction[1]}"
