"""Topology files: YAML to a validated Topology and back."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NotRequired, TypedDict

from testbed.common.fields import Fields, at_most, boolean, integer, number, positive, text
from testbed.common.sizes import MAX_GPUS
from testbed.common.units import (
    format_duration,
    format_flops,
    format_fraction,
    format_rate,
    format_size,
    parse_duration,
    parse_flops,
    parse_fraction,
    parse_size,
)
from testbed.common.yamlio import read_yaml
from testbed.topology.limits import DC_LATENCY, RATE, WAN_LATENCY
from testbed.topology.model import (
    BUILTIN_GPU_TYPES,
    CONGESTION_CONTROLS,
    DC_NAME,
    GPU_TYPE_NAME,
    TOPOLOGY_NAME,
    Datacenter,
    GpuType,
    TcpSettings,
    Topology,
    WanLink,
)

TOPOLOGY_KEYS = ("name", "tcp", "gpu_types", "datacenters", "wan", "job", "events")
DATACENTER_KEYS = ("name", "gpus", "gpu", "bandwidth", "latency", "tcp")
LINK_KEYS = ("between", "latency", "bandwidth", "jitter", "loss", "queue")


def load_topology(path: str | Path) -> Topology:
    data = read_yaml(path)
    default_name = Path(path).stem
    return parse_topology(data, str(path), default_name)


def parse_topology(
    data: object, source: str | None = None, default_name: str = "topology"
) -> Topology:
    top = Fields(data, source, keys=TOPOLOGY_KEYS)
    name = top.get("name", text, default_name)
    if not TOPOLOGY_NAME.match(name):
        raise top.error("name", f"{name!r} is not a usable name (letters, digits, '_', '.', '-')")
    tcp = _parse_tcp(top.section("tcp")) if top.has("tcp") else TcpSettings()
    gpu_types = dict(BUILTIN_GPU_TYPES)
    gpu_types.update(_parse_gpu_types(top.section("gpu_types")))
    datacenters = _parse_datacenters(top, gpu_types)
    links = _parse_links(top, {dc.name for dc in datacenters})
    job = top.raw("job", None)
    if job is not None and not isinstance(job, dict):
        raise top.error("job", "expected a mapping")
    events = top.raw("events", None)
    if events is not None and not isinstance(events, list):
        raise top.error("events", "expected a list")
    top.done()
    topology = Topology(name, tuple(datacenters), tuple(links), tcp, job,
                        tuple(events) if events is not None else None, source)
    _check_connected(topology, top)
    if events is not None:
        from testbed.topology.net_events import parse_events

        parse_events(list(events), topology, source)  # refuse a bad event now
    return topology


def _parse_tcp(fields: Fields | None) -> TcpSettings:
    if fields is None:
        return TcpSettings()
    default = TcpSettings()
    congestion = fields.get("congestion", text, default.congestion)
    if congestion not in CONGESTION_CONTROLS:
        raise fields.error(
            "congestion",
            f"unknown congestion control {congestion!r} (one of {', '.join(CONGESTION_CONTROLS)})",
        )
    rmem = fields.get("rmem", _buffer_triple(default.rmem), default.rmem)
    wmem = fields.get("wmem", _buffer_triple(default.wmem), default.wmem)
    idle = fields.get("slow_start_after_idle", boolean, default.slow_start_after_idle)
    fields.done()
    return TcpSettings(congestion, rmem, wmem, idle)


def _buffer_triple(default: tuple[int, int, int]) -> Any:
    """`4MiB` sets the maximum; `[4KiB, 128KiB, 6MiB]` sets min, default and max."""

    def parse(value: Any) -> tuple[int, int, int]:
        if isinstance(value, list):
            if len(value) != 3:
                raise ValueError("expected [min, default, max] or one maximum size")
            low, mid, high = (parse_size(v) for v in value)
        else:
            high = parse_size(value)
            low, mid = min(default[0], high), min(default[1], high)
        if not 0 < low <= mid <= high:
            raise ValueError("buffer sizes must be positive and ordered min <= default <= max")
        return (low, mid, high)

    return parse


def _parse_gpu_types(fields: Fields | None) -> dict[str, GpuType]:
    if fields is None:
        return {}
    types = {}
    for name in fields.data:
        if not GPU_TYPE_NAME.match(name):
            raise fields.error(name, f"{name!r} is not a usable GPU type name")
        spec = fields.section(name, required=True, keys=("peak", "memory", "efficiency"))
        assert spec is not None
        types[name] = _gpu_type(name, spec)
    fields.done()
    return types


def _gpu_type(name: str, spec: Fields) -> GpuType:
    peak = spec.get("peak", positive(parse_flops))
    memory = spec.get("memory", positive(parse_size))
    efficiency = spec.get("efficiency", positive(number), 0.5)
    if efficiency > 1.0:
        raise spec.error("efficiency", f"must be at most 1, got {efficiency}")
    spec.done()
    return GpuType(name, peak, memory, efficiency)


def _parse_datacenters(top: Fields, gpu_types: dict[str, GpuType]) -> list[Datacenter]:
    datacenters: list[Datacenter] = []
    seen: set[str] = set()
    for key, item in top.items("datacenters", required=True):
        fields = Fields(item, top.source, key, DATACENTER_KEYS)
        name = fields.get("name", text)
        if not DC_NAME.match(name):
            raise fields.error(
                "name",
                f"{name!r} cannot become a namespace or interface name "
                "(1-12 lower-case letters and digits, starting with a letter)",
            )
        if name in seen:
            raise fields.error("name", f"duplicate datacenter name {name!r}")
        seen.add(name)
        gpus = fields.get("gpus", at_most(positive(integer), MAX_GPUS))
        gpu = _dc_gpu(fields, gpu_types)
        bandwidth = fields.get("bandwidth", RATE, 100e9)
        latency = fields.get("latency", DC_LATENCY, 0.0)
        tcp = _parse_tcp(fields.section("tcp")) if fields.has("tcp") else None
        fields.done()
        datacenters.append(Datacenter(name, gpus, gpu, bandwidth, latency, tcp))
    if not datacenters:
        raise top.error("datacenters", "at least one datacenter is needed")
    total = sum(dc.gpus for dc in datacenters)
    if total > MAX_GPUS:
        raise top.error("datacenters", f"{total:,} GPUs in all, more than testbed's limit of "
                        f"{MAX_GPUS:,}")
    return datacenters


def _dc_gpu(fields: Fields, gpu_types: dict[str, GpuType]) -> GpuType:
    value = fields.raw("gpu", "a100")
    if not isinstance(value, str) or value not in gpu_types:
        known = ", ".join(sorted(gpu_types))
        raise fields.error(
            "gpu", f"unknown GPU type {value!r} (known: {known}; define others under gpu_types)"
        )
    return gpu_types[value]


def _parse_links(top: Fields, dc_names: set[str]) -> list[WanLink]:
    links: list[WanLink] = []
    for key, item in top.items("wan"):
        fields = Fields(item, top.source, key, LINK_KEYS)
        between = fields.raw("between")
        if (
            not isinstance(between, list)
            or len(between) != 2
            or not all(isinstance(x, str) for x in between)
        ):
            raise fields.error("between", "expected two datacenter names, like [east, west]")
        a, b = between
        for end in (a, b):
            if end not in dc_names:
                raise fields.error("between", f"unknown datacenter {end!r}")
        if a == b:
            raise fields.error(
                "between", f"a link needs two different datacenters, got {a!r} twice"
            )
        link = WanLink(
            a,
            b,
            latency_s=fields.get("latency", WAN_LATENCY),
            bandwidth_bps=fields.get("bandwidth", RATE),
            jitter_s=fields.get("jitter", positive(parse_duration, allow_zero=True), 0.0),
            loss=fields.get("loss", parse_fraction, 0.0),
            queue_bytes=fields.get("queue", positive(parse_size), None),
        )
        if link.jitter_s > link.latency_s:
            raise fields.error(
                "jitter", "jitter larger than the latency would make delays negative"
            )
        if link.loss >= 1.0:
            raise fields.error("loss", "a link that loses every packet carries nothing")
        for index, other in enumerate(links):
            if other.joins(a, b):
                same = (
                    other.latency_s,
                    other.bandwidth_bps,
                    other.jitter_s,
                    other.loss,
                    other.queue_bytes,
                ) == (
                    link.latency_s,
                    link.bandwidth_bps,
                    link.jitter_s,
                    link.loss,
                    link.queue_bytes,
                )
                kind = "duplicate" if same else "asymmetric duplicate (different values)"
                raise fields.error(
                    "between",
                    f"{kind} of wan[{index}] between {a} and {b}; links are "
                    "symmetric, give each pair once",
                )
        fields.done()
        links.append(link)
    return links


def _check_connected(topology: Topology, top: Fields) -> None:
    names = [dc.name for dc in topology.datacenters]
    for other in names[1:]:
        try:
            topology.path(names[0], other)
        except KeyError:
            raise top.error("wan", f"no WAN path between {names[0]} and {other}") from None


class TcpSection(TypedDict):
    congestion: str
    rmem: list[str]
    wmem: list[str]
    slow_start_after_idle: bool


class GpuSection(TypedDict):
    peak: str
    memory: str
    efficiency: float


class DatacenterEntry(TypedDict):
    name: str
    gpus: int
    gpu: str
    bandwidth: str
    latency: str
    tcp: NotRequired[TcpSection]


class LinkEntry(TypedDict):
    between: list[str]
    latency: str
    bandwidth: str
    jitter: NotRequired[str]
    loss: NotRequired[str]
    queue: NotRequired[str]


class TopologyDocument(TypedDict):
    """A topology file as dump_topology writes it (quantities as text, as a file has
    them); the `job` and `events` it carries are as the file gave them."""

    name: str
    tcp: TcpSection
    gpu_types: NotRequired[dict[str, GpuSection]]
    datacenters: list[DatacenterEntry]
    wan: list[LinkEntry]
    job: NotRequired[dict[str, object]]
    events: NotRequired[list[object]]


def dump_topology(topology: Topology) -> TopologyDocument:
    """Plain data that `parse_topology` reads back to an equal Topology."""
    custom: dict[str, GpuSection] = {}
    for dc in topology.datacenters:
        if BUILTIN_GPU_TYPES.get(dc.gpu.name) != dc.gpu:
            custom[dc.gpu.name] = _dump_gpu(dc.gpu)
    data: TopologyDocument = {"name": topology.name, "tcp": _dump_tcp(topology.tcp),
                              "gpu_types": custom,
                              "datacenters": [_dump_dc(dc) for dc in topology.datacenters],
                              "wan": [_dump_link(link) for link in topology.links]}
    if not custom:
        del data["gpu_types"]
    if topology.job is not None:
        data["job"] = dict(topology.job)
    if topology.events is not None:
        data["events"] = list(topology.events)
    return data


def _dump_tcp(tcp: TcpSettings) -> TcpSection:
    return {
        "congestion": tcp.congestion,
        "rmem": [format_size(v) for v in tcp.rmem],
        "wmem": [format_size(v) for v in tcp.wmem],
        "slow_start_after_idle": tcp.slow_start_after_idle,
    }


def _dump_gpu(gpu: GpuType) -> GpuSection:
    return {
        "peak": format_flops(gpu.peak_flops),
        "memory": format_size(gpu.memory_bytes),
        "efficiency": gpu.efficiency,
    }


def _dump_dc(dc: Datacenter) -> DatacenterEntry:
    out: DatacenterEntry = {
        "name": dc.name,
        "gpus": dc.gpus,
        "gpu": dc.gpu.name,
        "bandwidth": format_rate(dc.bandwidth_bps),
        "latency": format_duration(dc.latency_s),
    }
    if dc.tcp is not None:
        out["tcp"] = _dump_tcp(dc.tcp)
    return out


def _dump_link(link: WanLink) -> LinkEntry:
    out: LinkEntry = {
        "between": [link.a, link.b],
        "latency": format_duration(link.latency_s),
        "bandwidth": format_rate(link.bandwidth_bps),
    }
    if link.jitter_s:
        out["jitter"] = format_duration(link.jitter_s)
    if link.loss:
        out["loss"] = format_fraction(link.loss)
    if link.queue_bytes is not None:
        out["queue"] = format_size(link.queue_bytes)
    return out
