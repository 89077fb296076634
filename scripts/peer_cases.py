"""The transfers scripts/bench_peers.py measures, as topologies every backend reads: flows
of given round trips sharing one bottleneck (a hub DC and a link to the receiver), bursts
of equal messages started together over one bottleneck, one WAN link with loss, one long
flow on Linux-default buffers, and many flows over shared links for the solvers' cost."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.common.units import parse_rate
from testbed.topology import Topology, parse_topology

BOTTLENECK_ONE_WAY_MS = 2.0
"""The bottleneck link's own one-way latency: the rest of each flow's RTT is on its access
link, so the flows differ only in RTT."""


@dataclass(frozen=True)
class ShareCase:
    """Long flows of these RTTs, one connection each, sharing a bottleneck of `rate`."""

    name: str
    rtts_ms: tuple[float, ...]
    rate: str
    congestion: str
    paced: bool
    queue: str | None = None
    """The bottleneck's drop-tail queue (a size); None: as the shaper sizes it."""

    def recorded(self) -> dict[str, Any]:
        """The case as a recording keeps it beside its runs (scripts/peer_emulator.py)."""
        queue = {} if self.queue is None else {"queue": self.queue}
        return {"case": self.name, "rtts_ms": list(self.rtts_ms), "congestion": self.congestion,
                "paced": self.paced, "rate": self.rate, **queue}

    @classmethod
    def from_recorded(cls, entry: dict[str, Any]) -> ShareCase:
        """The case a recorded entry was measured on."""
        return cls(entry["case"], tuple(entry["rtts_ms"]), entry["rate"], entry["congestion"],
                   entry["paced"], entry.get("queue"))


@dataclass(frozen=True)
class TransferCase:
    """`megabytes` over `connections` fresh connections on one link."""

    name: str
    rtt_ms: float
    rate: str
    congestion: str
    loss: float
    connections: int
    megabytes: float
    wmem: tuple[int, int, int] | None = None


@dataclass(frozen=True)
class BurstCase:
    """Rounds of `flows` messages of `megabytes` each, from `flows` hosts of one DC to as
    many of another, one connection apiece kept from round to round, each round's started
    together over the WAN link between them, one every `every_s`: a pipeline's replicas
    sending their activations at once, as on paper-3dc, paced as the plan paces."""

    name: str
    flows: int
    rtt_ms: float
    rate: str
    congestion: str
    megabytes: float

    @property
    def every_s(self) -> float:
        """Three times what a round's bytes take at the link's rate, two seconds at least:
        a round has ended before the next starts, after an idle of several RTOs."""
        return max(2.0, 3 * self.flows * self.megabytes * 1e6 * 8 / parse_rate(self.rate))


def burst_topology(case: BurstCase) -> Topology:
    """east-i sends to west-i over one WAN link; its drop-tail queue as the shaper sizes
    it by default (one bandwidth-delay product of the link's round trip)."""
    return parse_topology({
        "name": case.name, "tcp": {"congestion": case.congestion},
        "datacenters": [{"name": "east", "gpus": case.flows},
                        {"name": "west", "gpus": case.flows}],
        "wan": [{"between": ["east", "west"], "latency": f"{case.rtt_ms / 2:g}ms",
                 "bandwidth": case.rate}]}, "bench_peers")


def share_topology(case: ShareCase) -> Topology:
    """s0..sN each reach the receiver `dst` through `hub`; hub to dst is the bottleneck,
    its drop-tail queue as the shaper sizes it by default: one bandwidth-delay product of
    the link's own round trip, 64 KiB at least."""
    dcs: list[dict[str, Any]] = [{"name": f"s{i}", "gpus": 1} for i in range(len(case.rtts_ms))]
    dcs += [{"name": "hub", "gpus": 1}, {"name": "dst", "gpus": 1}]
    wan: list[dict[str, Any]] = [
        {"between": [f"s{i}", "hub"], "latency": f"{rtt / 2 - BOTTLENECK_ONE_WAY_MS:g}ms",
         "bandwidth": "10Gbit"} for i, rtt in enumerate(case.rtts_ms)]
    bottleneck = {"between": ["hub", "dst"], "latency": f"{BOTTLENECK_ONE_WAY_MS:g}ms",
                  "bandwidth": case.rate}
    wan.append(bottleneck if case.queue is None else {**bottleneck, "queue": case.queue})
    return parse_topology({"name": case.name, "tcp": {"congestion": case.congestion},
                           "datacenters": dcs, "wan": wan}, "bench_peers")


def transfer_topology(case: TransferCase) -> Topology:
    tcp: dict[str, Any] = {"congestion": case.congestion}
    if case.wmem is not None:
        tcp["wmem"] = list(case.wmem)
        tcp["rmem"] = list(case.wmem)
    return parse_topology({
        "name": case.name, "tcp": tcp,
        "datacenters": [{"name": "east", "gpus": 1}, {"name": "west", "gpus": 1}],
        "wan": [{"between": ["east", "west"], "latency": f"{case.rtt_ms / 2:g}ms",
                 "bandwidth": case.rate, "loss": case.loss}]}, "bench_peers")


EIGHT_RTTS_MS = (10.0, 20.0, 40.0, 60.0, 90.0, 120.0, 160.0, 200.0)


def share_cases(congestions: tuple[str, ...]) -> list[ShareCase]:
    out = []
    for cc in congestions:
        for paced in (False, True):
            out.append(ShareCase(f"two-{cc}-{'paced' if paced else 'unpaced'}", (20.0, 100.0),
                                 "200Mbit", cc, paced))
        for paced in (False, True):
            out.append(ShareCase(f"eight-{cc}-{'paced' if paced else 'unpaced'}", EIGHT_RTTS_MS,
                                 "200Mbit", cc, paced))
    return out


OTHER_RATES = ("50Mbit", "400Mbit")
"""Bottleneck rates of the share check out of sample: the RTT bias was fitted on runs at
200 Mbit/s only. A flow's window at its share, and so the part of it CUBIC grows by its
cubic function rather than Reno's rule (RFC 8312), moves with the rate, so a bias fitted
at one rate need not hold at another."""


DEEP_QUEUE = "2500KB"
"""A bottleneck queue of one bandwidth-delay product of the longer flow's round trip at
200 Mbit/s (100 ms), as deep against the flows' round trips as the queue the shaper
gives a WAN link by default (one bandwidth-delay product of the link's own round trip)."""


HALF_DEEP_QUEUE = "1250KB"
"""Half DEEP_QUEUE (50 ms at 200 Mbit/s): recorded after the model counted its
bottleneck's standing queue in the RTT bias (testbed.plan.tcp_model.STANDING_QUEUE), to
check that queue at a depth neither the exponents' fit nor the choice of its half saw."""


def held_out_share_cases(congestions: tuple[str, ...]) -> list[ShareCase]:
    """The two flows of 20 and 100 ms, unpaced and paced, on each of OTHER_RATES, and at
    200 Mbit/s behind DEEP_QUEUE and HALF_DEEP_QUEUE."""
    return [ShareCase(f"two-{cc}-{'paced' if paced else 'unpaced'}-{where}", (20.0, 100.0),
                      rate, cc, paced, queue)
            for cc in congestions
            for where, rate, queue in [*((rate, rate, None) for rate in OTHER_RATES),
                                       ("deep", "200Mbit", DEEP_QUEUE),
                                       ("half-deep", "200Mbit", HALF_DEEP_QUEUE)]
            for paced in (False, True)]


BURST_MEGABYTES = 20.97152
"""A pipeline boundary's activations on paper-3dc: 21 MB per microbatch (20 MiB)."""


def burst_cases(congestions: tuple[str, ...]) -> list[BurstCase]:
    """Two, four and eight flows of paper-3dc's activations over its 1 Gbit/s links at a
    40 ms round trip (east to central)."""
    return [BurstCase(f"burst-{cc}-{n}", n, 40.0, "1Gbit", cc, BURST_MEGABYTES)
            for cc in congestions for n in (2, 4, 8)]


LOSS_MEGABYTES = {1e-4: 20.0, 1e-3: 20.0, 1e-2: 4.0}
"""Per loss rate, bytes that a fresh connection moves in seconds, not minutes."""


def _lossy_cases(part: str, megabytes: dict[float, float], connections: tuple[int, ...],
                 congestions: tuple[str, ...]) -> list[TransferCase]:
    """Fresh connections on a lossy 1 Gbit/s, 50 ms link: per loss rate its bytes."""
    return [TransferCase(f"{part}-{cc}-{loss:g}-{n}", 50.0, "1Gbit", cc, loss, n, mb)
            for cc in congestions for loss, mb in megabytes.items() for n in connections]


def loss_cases(congestions: tuple[str, ...]) -> list[TransferCase]:
    return _lossy_cases("loss", LOSS_MEGABYTES, (1, 4, 16), congestions)


BETWEEN_MEGABYTES = {3e-4: 20.0, 3e-3: 4.0}
"""Loss rates between the loss cases', for a check out of sample: the loss model was built
on the loss cases' runs; these it did not see."""


def between_cases(congestions: tuple[str, ...]) -> list[TransferCase]:
    return _lossy_cases("between", BETWEEN_MEGABYTES, (1, 4), congestions)


def stripe_cases(congestions: tuple[str, ...]) -> list[TransferCase]:
    """The lossy cases over several connections at the loss rates where a connection's
    first loss most likely comes early in its slow start (0.1% and 1%)."""
    return [c for c in loss_cases(congestions) if c.connections > 1 and c.loss >= 1e-3]


def long_cases(congestions: tuple[str, ...]) -> list[TransferCase]:
    return [TransferCase(f"long-{cc}-{rtt:g}", rtt, "1Gbit", cc, 0.0, 1, 200.0)
            for cc in congestions for rtt in (50.0, 100.0)]


WINDOW_RATES = ("1Gbit", "2Gbit", "4Gbit", "10Gbit")
"""Bottleneck rates at which one connection's window is measured: a window-limited
connection keeps more of its send buffer in flight on a faster bottleneck."""


def window_cases() -> list[TransferCase]:
    """200 MB over one CUBIC connection with Linux's default buffers at a 40 ms round trip,
    where its window, not the link, limits it, on each of WINDOW_RATES."""
    return [TransferCase(f"window-{rate}", 40.0, rate, "cubic", 0.0, 1, 200.0)
            for rate in WINDOW_RATES]


@dataclass(frozen=True)
class ScaleFlow:
    src: str
    dst: str
    nbytes: float
    start: float
    route: tuple[str, ...]
    rtt: float


@dataclass(frozen=True)
class ScaleJob:
    """`flows` flows over four DCs' WAN mesh and their hosts' NICs, started within a
    second, every window already open: what the cost of sharing alone is measured on
    (SimGrid's model has no slow start)."""

    capacity: dict[str, float]
    latency: dict[str, float]
    flows: tuple[ScaleFlow, ...]


SCALE_DCS = 4
SCALE_HOSTS = 64
SCALE_ONE_WAY_S = {(0, 1): 0.010, (0, 2): 0.020, (0, 3): 0.030, (1, 2): 0.015, (1, 3): 0.025,
                   (2, 3): 0.012}


def scale_job(flows: int, seed: int = 0) -> ScaleJob:
    import random

    rng = random.Random(seed)
    capacity: dict[str, float] = {}
    latency: dict[str, float] = {}
    for (a, b), one_way in SCALE_ONE_WAY_S.items():
        for x, y in ((a, b), (b, a)):
            capacity[f"wan:{x}>{y}"] = 1e9
            latency[f"wan:{x}>{y}"] = one_way
    for dc in range(SCALE_DCS):
        for host in range(SCALE_HOSTS):
            for side in ("up", "down"):
                capacity[f"{side}:{dc}-{host}"] = 10e9
                latency[f"{side}:{dc}-{host}"] = 5e-6
    out = []
    for _ in range(flows):
        a = rng.randrange(SCALE_DCS)
        b = rng.choice([d for d in range(SCALE_DCS) if d != a])
        src, dst = f"{a}-{rng.randrange(SCALE_HOSTS)}", f"{b}-{rng.randrange(SCALE_HOSTS)}"
        one_way = SCALE_ONE_WAY_S[(min(a, b), max(a, b))]
        out.append(ScaleFlow(src, dst, rng.uniform(1e6, 1e8), rng.uniform(0.0, 1.0),
                             (f"up:{src}", f"wan:{a}>{b}", f"down:{dst}"), 2 * one_way + 2e-5))
    return ScaleJob(capacity, latency, tuple(out))


CEILING = TransferCase("ceiling", 50.0, "1Gbit", "bbr", 1e-7, 16, 200.0)
"""Where the emulator forwards every packet singly (any loss turns the TUN's offloads
off): 200 MB over 16 connections with a loss too small to matter. Its rate is this
machine's forwarding limit without offloads, which the lossy cases may meet."""
