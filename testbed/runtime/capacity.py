"""What this machine can forward through the emulated WAN: a short probe, cached.

`--dilation auto` divides the plan's peak byte rate by this figure. The probe brings up a
two-host network joined by one fast, short link through the same shaper a run would use,
and times the worker transport moving a few large messages over four connections: the
forwarding cost (delay line, kernel, Python) that every emulated byte pays.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from testbed.fsutil import write_atomic
from testbed.net.network import bring_up, tear_down
from testbed.runtime.probe import timed_messages
from testbed.topology import parse_topology

CACHE = Path(os.environ.get("TESTBED_CACHE", "/var/cache/testbed")) / "capacity.json"
PROBE_BYTES = 64 * 2**20
PROBE_MESSAGES = 3
PROBE_CONNECTIONS = 4


def _key() -> str:
    return f"{platform.release()} cpus={os.cpu_count()}"


def cached_capacity() -> float | None:
    try:
        data = json.loads(CACHE.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("machine") != _key():
        return None
    value = data.get("bps")
    return float(value) if isinstance(value, int | float) and value > 0 else None


def machine_capacity_bps(say: Callable[[str], None] = lambda _m: None) -> float:
    """Bits per second this machine moves through one emulated link (cached per kernel
    and core count)."""
    cached = cached_capacity()
    if cached is not None:
        return cached
    say("measuring what this machine can forward (once; cached in "
        f"{CACHE})")
    bps = _probe()
    CACHE.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(CACHE, json.dumps({"machine": _key(), "bps": bps,
                                    "measured": time.strftime("%Y-%m-%dT%H:%M:%S")}), 0o644)
    return bps


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
