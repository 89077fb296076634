"""How fast a cross-DC pair's striped connections may send: the one rule both backends
assume.

Unpaced TCP (cubic, reno) sends each window as a burst. N striped connections with open
windows burst together into the bottleneck's drop-tail queue, lose segments together and
wait out retransmissions: measured on a 20 ms, 1 Gbit/s emulated link, 21 MB over 4 warm
unpaced connections took 0.23-1.07 s, over 4 paced ones 0.20 s every time
(`scripts/bench_transport.py --pacing`). A real deployment paces (BBR does by design;
Linux paces any socket with a pacing cap, without the fq qdisc), and the simulator's
fluid model has no loss, i.e. it assumes paced senders. So the emulator caps each
connection at its share of the path's rate.
"""

from __future__ import annotations

import itertools

from testbed.topology.model import Topology

PACING_SHARE = 0.97
"""Of the path's bottleneck rate, what a pair's connections may send together. Linux
counts paced bytes without the IP header (1480 of 1500) and the shaper counts with it, so
pacing at the full rate would still queue; 3% under keeps the queue short."""


PACING_RATIO = 10.0
"""Linux also paces a socket with a cap at a multiple of cwnd/srtt (tcp_pacing_ss_ratio and
tcp_pacing_ca_ratio, 2x and 1.2x by default): the emulator's hosts set the largest multiple
the kernel takes (10x), so the cap, not the window, sets the pace once the window has
grown; while it grows, each round's window leaves over a tenth of a round trip. The
simulator models both."""


def pair_pacing_bytes_per_s(path_bps: float, connections: int) -> float:
    """Bytes per second for each of `connections` striped connections on a path of
    `path_bps`."""
    return path_bps * PACING_SHARE / 8 / max(1, connections)


GRADIENTS = float("inf")
"""The message size to give `paced` for a gradient ring across DCs: always large."""


def paced(topology: Topology, src_dc: str, dst_dc: str, message_bytes: float) -> bool:
    """Whether a pair's connections are paced: across DCs, for messages larger than the
    smallest queue on the path (a smaller one cannot overflow it, however it bursts;
    pacing it would only spread it over a window's round trip)."""
    if src_dc == dst_dc:
        return False
    hops = topology.path(src_dc, dst_dc)
    queue = min(topology.link(a, b).effective_queue_bytes for a, b in itertools.pairwise(hops))
    return message_bytes > queue
