"""Messages between workers: their path and TCP connections, one message at a time per
pair (as on the emulator's transport), and on arbitrated links a grant from the same
arbiter the emulator's coordinator runs before the bytes may go.

Spans here are written as literals: a large run makes hundreds of thousands of them, and
a helper call each costs the simulator a noticeable share of its time."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable

from testbed.common.span_table import SpanTable
from testbed.plan.collective import Collective
from testbed.plan.jitter import Noise
from testbed.plan.model import Op, Plan, Sharing
from testbed.plan.pacing import GRADIENTS
from testbed.policy.arbiter import Arbiter
from testbed.policy.base import Transfer
from testbed.sim.flows import MIN_RTT_S, Share, pair_between
from testbed.sim.links import Links
from testbed.sim.network import FluidNetwork, Pair
from testbed.sim.workers import SimWorker
from testbed.topology.model import Topology

Arrival = Callable[[float], None]
Sent = Callable[[float, float], None]
"""(when the first byte left, when the last did)."""


class Transfers:
    def __init__(self, topology: Topology, plan: Plan, network: FluidNetwork, links: Links,
                 arbiter: Arbiter, spans: SpanTable, noise: Noise) -> None:
        self.topology, self.plan, self.network, self.links = topology, plan, network, links
        self.arbiter, self.spans, self.noise = arbiter, spans, noise
        self.pairs: dict[tuple[str, str], Pair] = {}
        self._pair_queue: dict[int, list[Arrival]] = {}
        self._starters: dict[int, Arrival] = {}
        self._transfer_ids = 0
        self._sent: dict[tuple[str, str, Op], int] = {}
        """Messages each pair has sent of each kind: with the pair and kind, a message's
        identity for its share's draw (testbed.plan.jitter.Noise.share)."""
        self._paths: dict[tuple[str, str], tuple[tuple[str, ...], float]] = {}

    def path(self, src: SimWorker, dst: SimWorker) -> tuple[tuple[str, ...], float]:
        """The resources a message crosses, and its one-way latency (the WAN's part asked
        each time: a network event can change it)."""
        key = (src.lead, dst.lead)
        known = self._paths.get(key)
        if known is None:
            hops = self.topology.path(src.dc, dst.dc)
            wan = [f"wan:{a}>{b}" for a, b in itertools.pairwise(hops)]
            inside = (self.topology.dc(src.dc).latency_s
                      + self.topology.dc(dst.dc).latency_s) / 2
            known = self._paths[key] = ((f"up:{src.lead}", *wan, f"down:{dst.lead}"), inside)
        resources, inside = known
        return resources, self.links.one_way(src.dc, dst.dc) + inside

    def pair(self, src: SimWorker, dst: SimWorker, latency: float, largest: float,
             now: float) -> Pair:
        """The pair's connections; `largest`: the biggest message they carry, which decides
        whether they are paced (testbed.plan.pacing), as in the emulator."""
        key = (src.lead, dst.lead)
        if key not in self.pairs:
            connections = self.plan.connections_between(src.lead, dst.lead) * len(src.gpus)
            self.pairs[key] = pair_between(self.topology, src.dc, dst.dc, connections,
                                           2 * latency, largest)
        pair = self.pairs[key]
        pair.set_loss(self.links.path_loss(src.dc, dst.dc))  # an event: for its next message
        # a latency event changes it for later rounds
        rtt = 2 * latency
        self.network.retime(now, pair, rtt if rtt > MIN_RTT_S else MIN_RTT_S)
        return pair

    def send(
        self,
        now: float,
        src: SimWorker,
        dst: SimWorker,
        nbytes: int,
        on_arrival: Arrival,
        op: Op,
        microbatch: int | None,
        iteration: int,
        stage: int,
        to_stage: int,
        collective: Collective | None = None,
    ) -> None:
        """`op`: SEND_F or SEND_B for pipeline messages (arbitrated where the plan says so),
        ALLREDUCE for a ring's chunks of `collective` (arbitrated where the plan orders
        its syncs: Plan.sync_order); `stage` sends to `to_stage` (of the GPUs' stages)."""
        resources, latency = self.path(src, dst)
        pair = self.pair(src, dst, latency, nbytes if op is not Op.ALLREDUCE else GRADIENTS,
                         now)
        latency *= self.noise.factor("network")  # this message's delay, not the path's RTT
        share: Share = 1.0
        if self.noise.share_cv(pair.sawtooth):  # numbered only where shares are drawn
            numbered = (src.lead, dst.lead, op)
            number = self._sent[numbered] = self._sent.get(numbered, -1) + 1
            share = functools.partial(_draw, self.noise, pair.sawtooth, numbered, number)
        link = None if src.dc == dst.dc else f"{src.dc}>{dst.dc}"

        def arrived(t: float, started: float) -> None:
            self.spans.add(dst.alone, "transfer", started, t, iteration,
                           {"microbatch": microbatch, "bytes": nbytes, "link": link,
                            "src": src.lead, "dst": dst.lead, "stage": to_stage,
                            "peer": src.lead})
            on_arrival(t)

        def sent(t1: float, t2: float) -> None:
            self.spans.add(src.alone, "send", t1, t2, iteration,
                           {"microbatch": microbatch, "bytes": nbytes, "link": link,
                            "peer": dst.lead, "stage": stage})
            self._next_on_pair(pair, t2)

        def begin(t: float, on_sent: Sent = sent) -> None:
            """Queue the message on its pair; `on_sent(t1, t2)` when its last byte left."""
            self._fifo(
                t,
                pair,
                lambda t1: self.network.start(
                    t1,
                    nbytes,
                    resources,
                    pair,
                    latency,
                    lambda t2: arrived(t2, t1),
                    lambda t2: on_sent(t1, t2),
                    share,
                ),
            )

        arbitrated = link is not None and (
            self.plan.sharing.get((src.dc, dst.dc)) is Sharing.ARBITRATED if op.is_send
            else self.plan.sync_order.arbitrated)
        if not arbitrated:
            begin(now)
            return
        self._transfer_ids += 1
        transfer = Transfer(
            self._transfer_ids,
            src.lead,
            dst.lead,
            src.dc,
            dst.dc,
            op,
            src.replica,
            stage,
            microbatch if microbatch is not None else -1,
            nbytes,
            now,
            iteration,
            collective,
        )

        def granted(t: float, requested: float = now) -> None:
            self.spans.add(src.alone, "wait_grant", requested, t, iteration,
                           {"microbatch": microbatch, "link": link, "peer": dst.lead,
                            "stage": stage})

            def left(t1: float, t2: float) -> None:
                sent(t1, t2)  # the last byte is on the link: the lane is free
                nxt = self.arbiter.release(transfer)
                if nxt is not None:
                    self._grant(t2, nxt)

            begin(t, left)

        self._starters[transfer.id] = granted
        chosen = self.arbiter.request(transfer)
        if chosen is not None:
            self._grant(now, chosen)

    def _fifo(self, now: float, pair: Pair, start: Arrival) -> None:
        """Messages between two workers go one at a time, in order (as in the transport)."""
        queue = self._pair_queue.setdefault(id(pair), [])
        queue.append(start)
        if len(queue) == 1:
            start(now)

    def _next_on_pair(self, pair: Pair, now: float) -> None:
        queue = self._pair_queue[id(pair)]
        queue.pop(0)
        if queue:
            queue[0](now)

    def _grant(self, now: float, transfer: Transfer) -> None:
        self._starters.pop(transfer.id)(now)


def _draw(noise: Noise, sawtooth: float, numbered: tuple[str, str, Op], number: int) -> float:
    """A message's share draw, made where the flow first shares a link (Flow.weight): most
    messages never do, and the draw is the message's own whenever it is made."""
    src, dst, op = numbered
    return noise.share(sawtooth, f"{src}>{dst}:{op.name}:{number}")
