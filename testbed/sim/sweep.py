"""What-if sweeps: the same topology and job with one knob turned, as pure transformations."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace

from testbed.errors import InputError
from testbed.job import Job
from testbed.job_file import apply_overrides, dump_job, parse_job
from testbed.topology.load import dump_topology, parse_topology
from testbed.topology.model import Topology
from testbed.units import parse_duration, parse_rate, plural

TOPOLOGY_KEYS = ("wan.latency", "wan.bandwidth", "dcs")


def parse_vary(text: str) -> tuple[str, list[str]]:
    """`wan.latency=10ms,20ms` -> ("wan.latency", ["10ms", "20ms"])."""
    key, sep, values = text.partition("=")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not sep or not key.strip() or not items:
        raise InputError(f"expected KEY=V1,V2,..., got {text!r}", "--vary")
    return key.strip(), items


def vary(topology: Topology, job: Job, key: str, value: str) -> tuple[Topology, Job]:
    """The topology and job with `key` set to `value` (a topology knob or any job key)."""
    try:
        if key == "wan.latency":
            latency = parse_duration(value)
            return replace(topology, links=tuple(replace(link, latency_s=latency)
                                                  for link in topology.links)), job
        if key == "wan.bandwidth":
            rate = parse_rate(value)
            return replace(topology, links=tuple(replace(link, bandwidth_bps=rate)
                                                  for link in topology.links)), job
        if key == "dcs":
            return first_dcs(topology, int(value)), job
    except ValueError as exc:
        raise InputError(f"bad value {value!r}: {exc}", "--vary", key) from None
    data = dump_job(job)
    apply_overrides(data, [f"{key.removeprefix('job.')}={value}"])
    return topology, parse_job(data, "--vary", "")


def first_dcs(topology: Topology, count: int) -> Topology:
    """The first `count` datacenters in file order and the links among them."""
    if not 1 <= count <= len(topology.datacenters):
        raise ValueError(f"the topology has {plural(len(topology.datacenters), 'datacenter')}")
    keep = {dc.name for dc in topology.datacenters[:count]}
    data = dump_topology(topology)
    data["datacenters"] = [d for d in data["datacenters"] if d["name"] in keep]
    data["wan"] = [w for w in data["wan"] if set(w["between"]) <= keep]
    return parse_topology(data, topology.source, topology.name)


def grid(varies: Sequence[tuple[str, list[str]]]) -> list[list[tuple[str, str]]]:
    """Every combination of the varied values."""
    return [list(zip([k for k, _ in varies], combo, strict=True))
            for combo in itertools.product(*(values for _, values in varies))]
