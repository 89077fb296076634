"""Where a plan's loss-based flows cross a WAN queue too shallow for their round trip: a
case the flow model gets only in part.

A link's drop-tail queue is one bandwidth-delay product of its own round trip by default:
what one loss-based flow over that link needs to keep it busy through a halving of its
window (Villamizar and Song 1994, "High performance TCP in ANSNET"), and no more than it
can fill. A flow routed over several links crosses each at its whole path's round trip,
longer than the link's own, so the link's queue is shallow for it. Real CUBIC or Reno
overflows it at the end of slow start, loses a burst, and at a long round trip takes
seconds to grow its window back, while another flow of the same pair may not, so a
plan's replicas part (measured on detour-3dc, scripts/fidelity_topologies; the fidelity
table, docs/simulator.md).

The simulator loses packets in a queue only where the windows it holds back outgrow it
on average (testbed.sim.queues; each pair keeps the threshold that sets, Pair.cut), not
in the bursts of a slow start, nor does a loss cost it a recovery, so a run names each
such crossing (results.json's `queue_mismatches`) rather than let its figure pass for
the network's.
The other way round, a queue deep enough for the longest round trip crossing it, which
shorter flows keep standing in front of the others' bytes and acknowledgements, the
simulator models (testbed.sim.queues). Where every pair that crosses a link has the
link's own round trip (one WAN hop each, default queues), none is named. BBR, which keeps
its window at a loss, is left out."""

from __future__ import annotations

import itertools
from typing import Literal, TypedDict

from testbed.plan.model import Plan
from testbed.plan.tcp_model import MSS, cuts_at_loss, loss_response
from testbed.topology.model import Topology

QueueKind = Literal["shallow"]
"""shallow: the queue drains in less than the pair's round trip."""


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
    shallow for the pair (by more than one segment), pair by pair in path order."""
    found: list[QueueMismatch] = []
    for src, dst in plan.sharing:  # every DC pair the plan sends over, each way
        if not cuts_at_loss(loss_response(topology.tcp_for(src).congestion)):
            continue  # BBR keeps its window at a loss
        round_trip = 2 * topology.one_way_latency(src, dst)
        for a, b in itertools.pairwise(topology.path(src, dst)):
            link = topology.link(a, b)
            if link.effective_queue_bytes + MSS < link.bandwidth_bps * round_trip / 8:
                found.append({"link": f"{a}>{b}", "pair": f"{src}>{dst}", "kind": "shallow",
                              "queue_s": link.queue_s, "round_trip_s": round_trip})
    return found


def mismatches_text(found: list[QueueMismatch]) -> str | None:
    """Each DC pair's worst crossing (its shallowest queue) and what it means, in one line;
    None where there is none."""
    worst: dict[str, QueueMismatch] = {}
    for entry in found:
        kept = worst.get(entry["pair"])
        if kept is None or entry["queue_s"] < kept["queue_s"]:
            worst[entry["pair"]] = entry
    if not worst:
        return None
    crossings = ", ".join(
        f"{pair} through {e['link']} ({e['kind']}: {e['queue_s'] * 1e3:.3g} ms of queue, "
        f"{e['round_trip_s'] * 1e3:.3g} ms round trip)" for pair, e in worst.items())
    return (f"{crossings}: real TCP loses in a queue shallower than its round trip; the "
            "simulator's queues lose only what windows hold beyond them, not slow start's "
            "bursts, so its time for this plan may be short (the simulator's docs, "
            "detour-3dc)")
