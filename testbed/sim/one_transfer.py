"""One message alone across a WAN link, as the simulator moves it: the same flow model and
connection state a run's transfers get (testbed.sim.transfers), for figures that compare
connection counts without a training job around them."""

from __future__ import annotations

from testbed.plan.pacing import paced
from testbed.sim.agenda import Agenda
from testbed.sim.network import RTO_MIN, WINDOW_EFFICIENCY, FluidNetwork, Pair
from testbed.topology.model import Topology


def one_transfer_s(topology: Topology, src_dc: str, dst_dc: str, nbytes: int,
                   connections: int, warm: bool) -> float:
    """Seconds from the first byte sent to the last received; `warm`: the connections'
    windows are already open (as between a training run's iterations with slow start
    after idle off), else they start from the initial window."""
    agenda = Agenda()
    network = FluidNetwork({"wan": topology.bottleneck_bps(src_dc, dst_dc)}, agenda.at)
    latency = topology.one_way_latency(src_dc, dst_dc)
    src, dst = topology.tcp_for(src_dc), topology.tcp_for(dst_dc)
    pair = Pair(connections, WINDOW_EFFICIENCY * min(src.wmem[2], dst.rmem[2]),
                2 * latency, src.slow_start_after_idle, src.rto_min_s or RTO_MIN,
                paced(topology, src_dc, dst_dc, nbytes))
    if warm:  # open, and just used: no restart after idle
        pair.cwnd, pair.last_active = pair.window, 0.0
    done: list[float] = []
    network.start(0.0, nbytes, ("wan",), pair, latency, done.append)
    agenda.run()
    return done[0]
