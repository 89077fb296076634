"""Topologies: datacenters, GPUs, WAN links and TCP settings, as plain validated data."""

from testbed.topology.load import dump_topology, load_topology, parse_topology
from testbed.topology.model import (
    Datacenter,
    Gpu,
    GpuType,
    TcpSettings,
    Topology,
    WanLink,
)

__all__ = [
    "Datacenter",
    "Gpu",
    "GpuType",
    "TcpSettings",
    "Topology",
    "WanLink",
    "dump_topology",
    "load_topology",
    "parse_topology",
]
