"""The design space an "up to" claim is searched over, every range sourced, and how one
point of it becomes a topology and job. Pure: searching lives in testbed.figures.frontier.

Where each range comes from:
- WAN one-way latency 5-150 ms (round trips of 10-300 ms): from neighbouring cloud regions
  to intercontinental pairs, as Azure's published inter-region round-trip statistics
  list them ("Azure network round-trip latency statistics"; 5-72 ms inside North
  America, which our wan-3dc and paper-3dc conditions cite, and some 300 ms between
  continents).
- WAN bandwidth 0.1-100 Gbit/s per DC pair: Azure ExpressRoute sells circuits from 50
  Mbit/s to 10 Gbit/s, and ExpressRoute Direct ports of 10 and 100 Gbit/s; gpt3-4dc.yaml
  gives its DCs 100 Gbit/s.
- TCP buffers from Linux's defaults (tcp_wmem max 4 MiB, tcp_rmem max 6 MiB:
  Documentation/networking/ip-sysctl.rst) up to the path's bandwidth-delay product, which
  tuning guides tell long fat networks to set them to (ESnet's fasterdata "Linux host
  tuning"; RFC 7323 for the window scaling that allows it).
- Models of 7B-175B: Llama 2 7B and 70B (Touvron et al. 2023) and GPT-3 175B (Brown et
  al. 2020), as testbed.job.model's presets have them, besides the conditions' own; a model too
  big for the conditions' GPUs gets tensor parallelism of 8 inside a server, as
  Megatron-LM trains on DGX A100s (Narayanan et al. 2021), and 8 times the GPUs per DC,
  so each DC keeps as many model replicas' worth of GPU groups.
- 2-5 DCs: from the smallest geo-distributed pipeline (two-dc.yaml) past the paper's
  testbed of 3 (and gpt3-4dc's 4); a DC added is a copy of the conditions' last one.
- Prefill arrivals for the BubbleTea claims: 100-1,600 requests/s around the 400 at
  which the claims are measured (see "BubbleTea" in the README: bubbles fill from about
  100 on).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from testbed.common.units import format_rate
from testbed.experiments.sweep import first_dcs, vary
from testbed.topology.model import TcpSettings, Topology


@dataclass(frozen=True)
class ModelScale:
    """How a model larger than the conditions' runs on their DCs."""

    tp: int = 1
    stages_per_dc: int | None = None
    """Pipeline stages per DC the job asks for, where one per DC cannot hold the model
    (GPT-3 175B: 32 layers per stage need 111 GiB of an 80 GB GPU at tp 8)."""


MODELS: Mapping[str, ModelScale] = {
    "llama2-7b": ModelScale(),
    "llama2-70b": ModelScale(tp=8),
    "gpt3-175b": ModelScale(tp=8, stages_per_dc=2),
}
OWN = ""
"""The conditions' own model (or DC count, or request rate): the knob left alone."""


class PointRecord(TypedDict, total=False):
    """A point as claims.json and the loss map's CSV record it (None: the conditions'
    own); empty in claims.json where no point was measured (Point.as_dict gives every
    key)."""

    wan_latency_ms: float
    wan_bandwidth_gbit: float
    tcp_buffers_of_bdp: float | None
    model: str | None
    dcs: int | None
    requests_per_s: int | None


@dataclass(frozen=True)
class Point:
    """One set of conditions in the design space."""

    latency_ms: float
    """Every WAN link's one-way latency."""
    bandwidth_gbit: float
    """Every WAN link's bandwidth."""
    buffers: float = 0.0
    """TCP's buffer maxima: 0 for the conditions' own (Linux's defaults), else this
    fraction of the bandwidth-delay product (never below the defaults)."""
    model: str = OWN
    dcs: int = 0
    """0: the conditions' own count."""
    rate: int = 0
    """Prefill requests per second for the BubbleTea claims; 0: the claims' own."""

    def key(self) -> tuple[Any, ...]:
        return dataclasses.astuple(self)

    def as_dict(self) -> PointRecord:
        return {"wan_latency_ms": self.latency_ms, "wan_bandwidth_gbit": self.bandwidth_gbit,
                "tcp_buffers_of_bdp": self.buffers or None, "model": self.model or None,
                "dcs": self.dcs or None, "requests_per_s": self.rate or None}

    def describe(self) -> str:
        """The point as a reader takes it in: what differs from the conditions."""
        parts = [f"one-way {self.latency_ms:g} ms", format_rate(self.bandwidth_gbit * 1e9)]
        if self.buffers:
            parts.append(f"TCP buffers {self.buffers:g} x the BDP "
                         f"({bdp_bytes(self) / 2**20:,.0f} MiB)")
        if self.model:
            scale = MODELS[self.model]
            parts.append(self.model + (f" (tp {scale.tp})" if scale.tp > 1 else ""))
        if self.dcs:
            parts.append(f"{self.dcs} DCs")
        if self.rate:
            parts.append(f"{self.rate} requests/s")
        return ", ".join(parts)


def bdp_bytes(point: Point) -> int:
    """One WAN path's bandwidth-delay product: bandwidth x round trip."""
    return math.ceil(point.bandwidth_gbit * 1e9 * 2 * point.latency_ms * 1e-3 / 8)


def apply(point: Point, topology: Topology) -> Topology:
    """The conditions' topology, and its job section, at this point."""
    out = with_dcs(topology, point.dcs) if point.dcs else topology
    out, _ = vary(out, _NO_JOB, "wan.latency", f"{point.latency_ms}ms")
    out, _ = vary(out, _NO_JOB, "wan.bandwidth", f"{point.bandwidth_gbit}Gbit")
    if point.buffers:
        out = dataclasses.replace(out, tcp=_buffers(out.tcp, point), datacenters=tuple(
            dataclasses.replace(dc, tcp=None if dc.tcp is None else _buffers(dc.tcp, point))
            for dc in out.datacenters))
    if point.model:
        out = _with_model(out, point.model)
    return out


_NO_JOB: Any = None
"""`vary` passes the job through untouched for topology keys."""


def _buffers(tcp: TcpSettings, point: Point) -> TcpSettings:
    size = math.ceil(point.buffers * bdp_bytes(point))
    return dataclasses.replace(tcp, wmem=(*tcp.wmem[:2], max(tcp.wmem[2], size)),
                               rmem=(*tcp.rmem[:2], max(tcp.rmem[2], size)))


def with_dcs(topology: Topology, count: int) -> Topology:
    """The first `count` DCs, or the conditions' DCs and copies of the last one (`dc4`,
    `dc5`...) linked to every other DC as the last one is to a neighbour."""
    if count <= len(topology.datacenters):
        return first_dcs(topology, count)
    dcs = list(topology.datacenters)
    last = dcs[-1]
    template = next(link for link in topology.links if last.name in link.pair)
    links = list(topology.links)
    for i in range(len(dcs) + 1, count + 1):
        name = f"dc{i}" if all(dc.name != f"dc{i}" for dc in dcs) else f"added{i}"
        links += [dataclasses.replace(template, a=other.name, b=name) for other in dcs]
        dcs.append(dataclasses.replace(last, name=name))
    return dataclasses.replace(topology, datacenters=tuple(dcs), links=tuple(links))


def _with_model(topology: Topology, model: str) -> Topology:
    scale = MODELS[model]
    job = copy.deepcopy(dict(topology.job or {}))
    job["model"] = model
    job["tp"] = scale.tp
    if scale.stages_per_dc:
        job["pp"] = scale.stages_per_dc * len(topology.datacenters)
    dcs = [dataclasses.replace(dc, gpus=dc.gpus * scale.tp) for dc in topology.datacenters]
    return dataclasses.replace(topology, datacenters=tuple(dcs), job=job)
