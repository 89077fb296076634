"""What this machine can do for an emulated run: how fast it forwards through the emulated
WAN, and what its CPU pays per worker action; each measured once and cached.

`--dilation auto` divides the plan's peak byte rate by the first. Its probe brings up a
two-host network joined by one fast, short link through the same shaper a run would use,
and times the worker transport moving a few large messages over four connections: the
forwarding cost (delay line, kernel, Python) that every emulated byte pays. The second
(testbed.runtime.coordinator.calibrate) runs a small pipeline of stage runners in this process.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testbed.common.fsutil import write_atomic
from testbed.common.jsonio import read_json
from testbed.errors import InputError
from testbed.net.network import bring_up, tear_down
from testbed.run.dilation import WorkerCosts
from testbed.runtime.coordinator.calibrate import measure_worker_costs
from testbed.runtime.coordinator.probe import timed_messages
from testbed.topology import parse_topology

CACHE = Path(os.environ.get("TESTBED_CACHE", "/var/cache/testbed")) / "capacity.json"
PROBE_BYTES = 64 * 2**20
PROBE_MESSAGES = 3
PROBE_CONNECTIONS = 4


def _key() -> str:
    return f"{platform.release()} cpus={os.cpu_count()}"


def _cached() -> dict[str, Any]:
    """This machine's cached figures (none from another kernel or core count)."""
    try:
        data = read_json(CACHE)
    except InputError:
        return {}
    return data if isinstance(data, dict) and data.get("machine") == _key() else {}


def _figure(name: str) -> float | None:
    value = _cached().get(name)
    return float(value) if isinstance(value, int | float) and value > 0 else None


def _remember(**figures: float | str) -> None:
    data = {**_cached(), "machine": _key(), **figures}
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(CACHE, json.dumps(data), 0o644)


def machine_capacity_bps(say: Callable[[str], None] = lambda _m: None) -> float:
    """Bits per second this machine moves through one emulated link (cached per kernel
    and core count)."""
    cached = _figure("bps")
    if cached is not None:
        return cached
    say("measuring what this machine can forward (once; cached in "
        f"{CACHE})")
    bps = _probe()
    _remember(bps=bps, measured=time.strftime("%Y-%m-%dT%H:%M:%S"))
    return bps


def worker_costs(say: Callable[[str], None] = lambda _m: None) -> WorkerCosts:
    """CPU per span a worker records and per idle worker (cached per kernel and core
    count)."""
    span, idle = _figure("span_cpu_s"), _figure("idle_worker_cpu")
    if span is not None and idle is not None:
        return WorkerCosts(span, idle)
    say(f"measuring what this machine's CPU pays per worker action (once; cached in {CACHE})")
    costs = measure_worker_costs()
    _remember(span_cpu_s=costs.span_cpu_s, idle_worker_cpu=costs.idle_cpu)
    return costs


def cores() -> int:
    """The cores this process may run on (and so the workers it starts)."""
    return len(os.sched_getaffinity(0))


def _probe() -> float:
    topology = parse_topology({
        "datacenters": [{"name": "pa", "gpus": 1}, {"name": "pb", "gpus": 1}],
        "wan": [{"between": ["pa", "pb"], "latency": "1ms", "bandwidth": "20Gbit"}]},
        "capacity-probe")
    network = bring_up(topology)
    try:
        seconds = timed_messages(network, "pa-0", "pb-0", PROBE_CONNECTIONS, PROBE_MESSAGES,
                                 PROBE_BYTES, timeout_s=120)
    finally:
        tear_down(network)
    rates = [PROBE_BYTES * 8 / t for t in seconds]
    return float(statistics.median(rates[1:] or rates))
