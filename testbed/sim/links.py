"""The WAN links as network events leave them: the capacities the flow model shares, the
latency each new transfer sees, and outages that stop a link until TCP's backoff notices
it is back."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterable

from testbed.net_events import Change
from testbed.sim.network import RTO_MIN, FluidNetwork, Schedule, resume_after_outage
from testbed.sim.workers import SimWorker
from testbed.topology.model import Topology


def link_key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


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


class Links:
    def __init__(self, topology: Topology, network: FluidNetwork, at: Schedule) -> None:
        self.topology, self.network, self.at = topology, network, at
        self.latency = {link_key(link.a, link.b): link.latency_s for link in topology.links}
        self.bandwidth = {link_key(link.a, link.b): link.bandwidth_bps for link in topology.links}
        self.loss = {link_key(link.a, link.b): link.loss for link in topology.links}
        self.down_since: dict[tuple[str, str], float] = {}
        self._routes: dict[tuple[str, str], list[tuple[str, str]]] = {}
        """The links of each DC pair's route, found once (every send asks)."""

    def one_way(self, src_dc: str, dst_dc: str) -> float:
        """Propagation delay along the route set up at the start, with event changes."""
        route = self._routes.get((src_dc, dst_dc))
        if route is None:
            hops = self.topology.path(src_dc, dst_dc)
            route = self._routes[(src_dc, dst_dc)] = [link_key(a, b)
                                                      for a, b in itertools.pairwise(hops)]
        return sum(self.latency[key] for key in route)

    def apply(self, change: Change, now: float) -> None:
        """A network event: latency for transfers that start from now on, bandwidth at
        once, an outage stops the link and TCP resumes after its retransmission backoff.
        Loss alone is not modeled (BBR, the default, keeps its rate under light loss)."""
        key = link_key(change.a, change.b)
        resources = (f"wan:{change.a}>{change.b}", f"wan:{change.b}>{change.a}")
        if change.latency_s is not None:
            self.latency[key] = change.latency_s
        if change.bandwidth_bps is not None:
            self.bandwidth[key] = change.bandwidth_bps
            if key not in self.down_since:
                for resource in resources:
                    self.network.set_capacity(now, resource, change.bandwidth_bps)
        if change.loss is None:
            return
        self.loss[key] = change.loss
        if change.loss >= 1.0 and key not in self.down_since:  # the link goes down
            self.down_since[key] = now
            for resource in resources:
                self.network.set_capacity(now, resource, 0.0)
        elif change.loss < 1.0 and key in self.down_since:  # and comes back
            outage = now - self.down_since[key]
            rto = (self.topology.tcp_for(key[0]).rto_min_s or RTO_MIN) + 2 * self.latency[key]
            back = self.down_since[key] + resume_after_outage(outage, rto)
            self.at(back, functools.partial(self._back, key, resources))

    def _back(self, key: tuple[str, str], resources: tuple[str, ...], now: float) -> None:
        if self.loss[key] >= 1.0:
            return  # down again before TCP came back: the next restore brings it back
        self.down_since.pop(key, None)
        for resource in resources:
            self.network.set_capacity(now, resource, self.bandwidth[key])
            self.network.restart_windows(now, resource)
