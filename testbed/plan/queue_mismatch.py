"""Where a plan's loss-based flows cross a WAN queue not sized for their round trip: cases
the flow model, whose queues delay no byte and drop none, misses.

A link's drop-tail queue is one bandwidth-delay product of its own round trip by default:
what one loss-based flow over that link needs to keep it busy through a halving of its
window (Villamizar and Song 1994, "High performance TCP in ANSNET"), and no more than it
can fill. Flows routed over several links break that in two ways, both measured on
detour-3dc and its variants (scripts/fidelity_topologies; the fidelity table,
docs/simulator.md):

- shallow: a flow crosses a link at its whole path's round trip, longer than the link's
  own, so the link's queue is shallow for it. Real CUBIC or Reno overflows it at the end
  of slow start, loses a burst, and at a long round trip takes seconds to grow its window
  back, while another flow of the same pair may not, so a plan's replicas part;
- deep: a queue deep enough for the longest round trip crossing it lets flows of a
  shorter one keep it standing full, and every packet behind them, another flow's
  acknowledgements among them, waits that long: a window-limited flow of the longer
  round trip slows down.

The simulator has neither loss from a full queue nor a queue's delay, so a run names each
such crossing (results.json's `queue_mismatches`) rather than let its figure pass for the
network's. Where every pair that crosses a link has the link's own round trip (one WAN
hop each, default queues), none is named. BBR, which keeps its window at a loss and its
bytes in flight near twice its estimate of the path's, is left out."""

from __future__ import annotations

import itertools
from typing import Literal, TypedDict

from testbed.plan.model import Plan
from testbed.plan.tcp_model import MSS, loss_response
from testbed.topology.model import Topology

QueueKind = Literal["shallow", "deep"]
"""shallow: the queue drains in less than the pair's round trip; deep: in more, on a link
that pairs of longer round trips cross too."""


class QueueMismatch(TypedDict):
    """results.json's `queue_mismatches` entries: one link direction and one DC pair whose
    flows cross it."""

    link: str
    """The link direction, `h>x`."""
    pair: str
    """The DC pair whose path crosses it, `x>y`."""
    kind: QueueKind
    queue_s: float
    """The link's drop-tail queue's drain time at its rate."""
    round_trip_s: float
    """The pair's round trip over the WAN links of its path."""


def queue_mismatches(topology: Topology, plan: Plan) -> list[QueueMismatch]:
    """Each link direction and loss-based DC pair of the plan crossing it whose queue is
    shallow or deep for the pair (QueueMismatch.kind; one segment either way is a queue
    sized for it), pair by pair in path order."""
    routes: list[tuple[str, float, list[tuple[str, str]]]] = []
    longest: dict[tuple[str, str], float] = {}  # by link direction: its pairs' longest trip
    for src, dst in plan.sharing:  # every DC pair the plan sends over, each way
        response = loss_response(topology.tcp_for(src).congestion)
        if response is None or response.beta >= 1:
            continue  # BBR keeps its window at a loss
        round_trip = 2 * topology.one_way_latency(src, dst)
        hops = list(itertools.pairwise(topology.path(src, dst)))
        routes.append((f"{src}>{dst}", round_trip, hops))
        for hop in hops:
            longest[hop] = max(longest.get(hop, 0.0), round_trip)
    found: list[QueueMismatch] = []
    for pair, round_trip, hops in routes:
        for a, b in hops:
            link = topology.link(a, b)
            queue, needs = link.effective_queue_bytes, link.bandwidth_bps * round_trip / 8
            if queue + MSS < needs:
                kind: QueueKind = "shallow"
            elif queue - MSS > needs and longest[a, b] > round_trip:
                kind = "deep"
            else:
                continue
            found.append({"link": f"{a}>{b}", "pair": pair, "kind": kind,
                          "queue_s": link.queue_s,
                          "round_trip_s": round_trip})
    return found


def mismatches_text(found: list[QueueMismatch]) -> str | None:
    """Each DC pair's worst crossing of each kind (its shallowest or deepest queue) and what
    it means, in one line; None where there is none."""
    worst: dict[tuple[str, str], QueueMismatch] = {}
    for entry in found:
        key, sign = (entry["pair"], entry["kind"]), 1 if entry["kind"] == "shallow" else -1
        kept = worst.get(key)
        if kept is None or sign * entry["queue_s"] < sign * kept["queue_s"]:
            worst[key] = entry
    if not worst:
        return None
    crossings = ", ".join(
        f"{pair} through {e['link']} ({kind}: {e['queue_s'] * 1e3:.3g} ms of queue, "
        f"{e['round_trip_s'] * 1e3:.3g} ms round trip)" for (pair, kind), e in worst.items())
    return (f"{crossings}: real TCP loses in a queue shallower than its round trip and waits "
            "in one kept standing by shorter flows; the simulator's queues drop and delay "
            "nothing, so its time for this plan may be short (the simulator's docs, "
            "detour-3dc)")
