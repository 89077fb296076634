"""A topology is plain data: datacenters, their GPUs, the WAN links between them, TCP settings."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

# A DC name becomes part of namespace names (`<prefix><dc>-<i>`), host names and interface
# names (`w-<dc>`, at most 15 bytes), so it is short, lower case and hyphen-free.
DC_NAME = re.compile(r"^[a-z][a-z0-9]{0,11}$")
GPU_TYPE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,31}$")
TOPOLOGY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
CONGESTION_CONTROLS = ("bbr", "cubic", "reno")


@dataclass(frozen=True)
class GpuType:
    """A kind of GPU: a built-in one (v100, a100, h100, h200) or one a topology defines."""

    name: str
    """What topology files call it: `a100`."""
    peak_flops: float
    """Peak dense FLOP/s at 16-bit precision (bf16 or fp16 tensor cores)."""
    memory_bytes: int
    """Memory of one GPU: what a stage's parameters, optimizer state and activations share."""
    efficiency: float = 0.5
    """Fraction of peak a training step sustains (model FLOPs utilization)."""

    @property
    def sustained_flops(self) -> float:
        """FLOP/s a training step sustains: peak times efficiency (what compute is costed at)."""
        return self.peak_flops * self.efficiency


BUILTIN_GPU_TYPES: Mapping[str, GpuType] = {
    gpu.name: gpu
    for gpu in (
        GpuType("v100", 125e12, 32 * 1024**3),
        GpuType("a100", 312e12, 80 * 1024**3),
        GpuType("h100", 989e12, 80 * 1024**3),
        GpuType("h200", 989e12, 141 * 1024**3),
    )
}


@dataclass(frozen=True)
class TcpSettings:
    """Per-namespace TCP knobs that decide how one flow behaves on a long link."""

    congestion: str = "cubic"
    """Congestion control: bbr, cubic or reno."""
    rmem: tuple[int, int, int] = (4096, 131072, 6 * 1024**2)
    """Receive buffer (min, default, max) in bytes, as `net.ipv4.tcp_rmem`."""
    wmem: tuple[int, int, int] = (4096, 16384, 4 * 1024**2)
    """Send buffer (min, default, max) in bytes, as `net.ipv4.tcp_wmem`."""
    slow_start_after_idle: bool = True
    """Whether a flow idle for a retransmission timeout starts again from slow start."""
    rto_min_s: float | None = None
    """TCP's minimum retransmission timeout; None leaves the kernel's (200 ms). Set by
    time dilation, not by topology files."""

    @property
    def window_bytes(self) -> int:
        """Largest window one flow can keep in flight: the smaller buffer maximum."""
        return min(self.rmem[2], self.wmem[2])

    def sysctls(self) -> dict[str, str]:
        """These settings as the sysctls a host namespace is given."""
        return {
            "net.ipv4.tcp_congestion_control": self.congestion,
            "net.ipv4.tcp_rmem": " ".join(map(str, self.rmem)),
            "net.ipv4.tcp_wmem": " ".join(map(str, self.wmem)),
            "net.ipv4.tcp_slow_start_after_idle": "1" if self.slow_start_after_idle else "0",
            "net.core.rmem_max": str(self.rmem[2]),
            "net.core.wmem_max": str(self.wmem[2]),
        } | ({} if self.rto_min_s is None
             else {"net.ipv4.tcp_rto_min_us": str(round(self.rto_min_s * 1e6))})


@dataclass(frozen=True)
class Datacenter:
    """One datacenter: its GPUs, all of one type, each in a host of its own."""

    name: str
    """Short, lower case, no hyphen (`east`): its GPUs are `<name>-0`, `<name>-1`, ..."""
    gpus: int
    """How many GPUs (and hosts) it has."""
    gpu: GpuType
    """The type of every GPU in it."""
    bandwidth_bps: float
    """Each host's link to its DC's router (both directions)."""
    latency_s: float
    """One-way host-to-host latency inside the DC (half on each host link)."""
    tcp: TcpSettings | None = None
    """Overrides the topology's TCP settings for this DC's hosts."""

    def host_names(self) -> list[str]:
        """Its GPUs' names in index order: `east-0`, `east-1`, ..."""
        return [f"{self.name}-{i}" for i in range(self.gpus)]


@dataclass(frozen=True)
class WanLink:
    """A WAN link between two datacenters, the same in both directions."""

    a: str
    """One end's datacenter name."""
    b: str
    """The other end's datacenter name."""
    latency_s: float
    """One-way, router to router."""
    bandwidth_bps: float
    """Bits per second in each direction."""
    jitter_s: float = 0.0
    """Delay variation (netem's jitter), seconds."""
    loss: float = 0.0
    """Fraction of packets lost, each direction."""
    queue_bytes: int | None = None
    """Drop-tail queue per direction; None means one bandwidth-delay product."""

    @property
    def pair(self) -> tuple[str, str]:
        """The two datacenters' names, as the file lists them."""
        return (self.a, self.b)

    @property
    def rtt_s(self) -> float:
        """Round trip over this link alone: twice its latency."""
        return 2.0 * self.latency_s

    @property
    def bdp_bytes(self) -> int:
        """Bandwidth-delay product: the bytes in flight that keep the link busy."""
        return int(self.bandwidth_bps * self.rtt_s / 8)

    @property
    def effective_queue_bytes(self) -> int:
        """The queue a shaper installs: configured, or one BDP, never under 64 KiB."""
        return self.queue_bytes if self.queue_bytes is not None else max(self.bdp_bytes, 65536)

    @property
    def queue_s(self) -> float:
        """How long its full queue takes to drain at its rate."""
        return self.effective_queue_bytes * 8 / self.bandwidth_bps

    def joins(self, x: str, y: str) -> bool:
        """Whether this link joins datacenters x and y (either way round)."""
        return {self.a, self.b} == {x, y}


@dataclass(frozen=True)
class Gpu:
    """One GPU; each sits in its own host namespace named like the GPU."""

    name: str
    """`<dc>-<index>` (`east-0`): how plans, placements and connections name it."""
    dc: str
    """Its datacenter's name."""
    index: int
    """Its place in its datacenter, from 0."""
    type: GpuType
    """Its type: FLOP/s and memory."""


@dataclass(frozen=True)
class Topology:
    """Datacenters, the WAN links between them and the hosts' TCP settings: what a policy
    plans for. GPUs are named `<dc>-<index>`; `gpus()` lists them in file order."""

    name: str
    """The topology's name (runs and results are named after it)."""
    datacenters: tuple[Datacenter, ...]
    """In file order: the order file-order placements take GPUs in."""
    links: tuple[WanLink, ...]
    """The WAN links; datacenters without a direct link reach each other over others
    (`path`), along the lowest-latency route."""
    tcp: TcpSettings = TcpSettings()
    """Every host's TCP settings, unless its datacenter overrides them (`tcp_for`)."""
    job: Mapping[str, Any] | None = None
    """The raw `job` section; `testbed.job.model` parses it."""
    events: tuple[Any, ...] | None = None
    """The raw `events` section; `testbed.topology.net_events` parses it against the links."""
    source: str | None = field(default=None, compare=False)
    """The file it was read from, for errors that name it (`InputError(..., topology.source,
    key)`); None when built in code."""

    def dc(self, name: str) -> Datacenter:
        """The datacenter of that name (KeyError if none)."""
        for dc in self.datacenters:
            if dc.name == name:
                return dc
        raise KeyError(name)

    def gpus(self) -> list[Gpu]:
        """All GPUs in file order: DCs as listed, GPUs by index."""
        return [
            Gpu(f"{dc.name}-{i}", dc.name, i, dc.gpu)
            for dc in self.datacenters
            for i in range(dc.gpus)
        ]

    def gpu(self, name: str) -> Gpu:
        """The GPU of that name, `east-0` (KeyError if none)."""
        dc_name, _, index = name.rpartition("-")
        dc = self.dc(dc_name)
        i = int(index)
        if not 0 <= i < dc.gpus:
            raise KeyError(name)
        return Gpu(name, dc.name, i, dc.gpu)

    def dc_of(self, gpu_name: str) -> str:
        """The name of the datacenter a GPU sits in: `dc_of("east-0")` is `east`."""
        dc_name, _, index = gpu_name.rpartition("-")
        if not 0 <= int(index) < self.dc(dc_name).gpus:
            raise KeyError(gpu_name)
        return dc_name

    def link(self, x: str, y: str) -> WanLink:
        """The direct WAN link between datacenters x and y (KeyError if none)."""
        for link in self.links:
            if link.joins(x, y):
                return link
        raise KeyError((x, y))

    def has_link(self, x: str, y: str) -> bool:
        """Whether datacenters x and y have a direct WAN link."""
        return any(link.joins(x, y) for link in self.links)

    def tcp_for(self, dc_name: str) -> TcpSettings:
        """The TCP settings of a datacenter's hosts: its own, else the topology's."""
        return self.dc(dc_name).tcp or self.tcp

    @property
    def total_gpus(self) -> int:
        """GPUs in every datacenter together."""
        return sum(dc.gpus for dc in self.datacenters)

    def path(self, src_dc: str, dst_dc: str) -> list[str]:
        """DCs a packet crosses from `src_dc` to `dst_dc`, along the lowest-latency route."""
        return shortest_path(self, src_dc, dst_dc)

    def iter_dc_pairs(self) -> Iterator[tuple[str, str]]:
        """Every pair of datacenter names once, in file order."""
        names = [dc.name for dc in self.datacenters]
        for i, x in enumerate(names):
            for y in names[i + 1 :]:
                yield x, y

    def one_way_latency(self, src_dc: str, dst_dc: str) -> float:
        """Router-to-router propagation delay along the routed path."""
        hops = self.path(src_dc, dst_dc)
        return sum(self.link(a, b).latency_s for a, b in itertools.pairwise(hops))

    def path_loss(self, src_dc: str, dst_dc: str) -> float:
        """The share of packets lost along the routed path (each link's loss in turn)."""
        kept = 1.0
        for a, b in itertools.pairwise(self.path(src_dc, dst_dc)):
            kept *= 1.0 - self.link(a, b).loss
        return 1.0 - kept

    def bottleneck_bps(self, src_dc: str, dst_dc: str) -> float:
        """The slowest link's bandwidth on the routed path (infinite within one DC)."""
        slowest = self.bottlenecks(src_dc, dst_dc)
        return slowest[0].bandwidth_bps if slowest else float("inf")

    def bottlenecks(self, src_dc: str, dst_dc: str) -> list[WanLink]:
        """The routed path's slowest links, in path order: one, or each of those that
        share the slowest rate (none within one DC)."""
        hops = [self.link(a, b) for a, b in itertools.pairwise(self.path(src_dc, dst_dc))]
        rate = min((link.bandwidth_bps for link in hops), default=float("inf"))
        return [link for link in hops if link.bandwidth_bps == rate]


def shortest_path(topology: Topology, src: str, dst: str) -> list[str]:
    """Dijkstra on latency; ties broken by DC order so routes are deterministic."""
    if src == dst:
        return [src]
    order = {dc.name: i for i, dc in enumerate(topology.datacenters)}
    best: dict[str, tuple[float, list[str]]] = {src: (0.0, [src])}
    done: set[str] = set()
    while True:
        frontier = [
            (cost, order[name], name) for name, (cost, _) in best.items() if name not in done
        ]
        if not frontier:
            raise KeyError(f"no WAN path from {src} to {dst}")
        cost, _, here = min(frontier)
        if here == dst:
            return best[here][1]
        done.add(here)
        for link in topology.links:
            if here not in link.pair:
                continue
            there = link.b if link.a == here else link.a
            new_cost = cost + link.latency_s
            if there not in best or new_cost < best[there][0]:
                best[there] = (new_cost, [*best[here][1], there])
