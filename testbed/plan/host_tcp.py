"""A plan's host TCP settings applied to the topology: what both backends run on."""

from __future__ import annotations

from dataclasses import replace

from testbed.plan.model import HostTcp, Plan
from testbed.topology.model import TcpSettings, Topology


def tuned(tcp: TcpSettings, wanted: HostTcp) -> TcpSettings:
    out = tcp
    if wanted.slow_start_after_idle is not None:
        out = replace(out, slow_start_after_idle=wanted.slow_start_after_idle)
    if wanted.buffer_bytes is not None:
        size = wanted.buffer_bytes
        out = replace(out, rmem=(min(out.rmem[0], size), min(out.rmem[1], size), size),
                      wmem=(min(out.wmem[0], size), min(out.wmem[1], size), size))
    return out


def hosts_as_planned(topology: Topology, plan: Plan) -> Topology:
    """The topology with the plan's host TCP settings on every DC the plan uses."""
    if not plan.host_tcp:
        return topology
    used = {topology.dc_of(gpu) for gpu in plan.used_gpus()}
    return replace(topology, datacenters=tuple(
        replace(dc, tcp=tuned(topology.tcp_for(dc.name), plan.host_tcp))
        if dc.name in used else dc for dc in topology.datacenters))
