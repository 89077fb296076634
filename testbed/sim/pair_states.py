"""The WAN pairs' TCP state as the model leaves it at a run's end: the simulator's side of
what an emulated run records of its kernels' sockets (`ss -tin`, results.json's
`wan_connections`), so that where each backend's slow starts stop can be set side by side.
Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from testbed.sim.flows import Pair
from testbed.topology.model import Topology


@dataclass(frozen=True)
class PairState:
    """One WAN pair's connections at the end: a clean path's are alike (one window for all,
    `connections` of them); a lossy path's each have their own loss cycle (one state each)."""

    host: str
    peer: str
    connections: int
    congestion: str
    base_rtt_s: float
    cwnd_bytes: float
    """Per connection."""
    ssthresh_bytes: float
    """Per connection, where its slow start ends (the model's cuts, or a loss cycle's last
    loss); inf: it never left slow start."""


def pair_states(pairs: Mapping[tuple[str, str], Pair], topology: Topology
                ) -> tuple[PairState, ...]:
    """The state of each pair whose ends sit in different DCs, keyed (sender, receiver) by
    their lead GPUs, in key order."""
    out: list[PairState] = []
    for (host, peer), pair in sorted(pairs.items()):
        dc = topology.dc_of(host)
        if dc == topology.dc_of(peer):
            continue
        congestion = topology.tcp_for(dc).congestion
        windows = [(1, c.cwnd, c.ssthresh) for c in pair.cycles] if pair.cycles \
            else [(pair.connections, pair.cwnd, pair.ssthresh)]
        out.extend(PairState(host, peer, count, congestion, pair.base_rtt, cwnd, ssthresh)
                   for count, cwnd, ssthresh in windows)
    return tuple(out)
