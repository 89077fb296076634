"""What this machine can do for an emulated run: how fast it forwards through the emulated
WAN, and what its CPU pays per worker action; each measured once and cached.

`--dilation auto` divides the plan's peak byte rate by the first. Its probe brings up a
two-host network joined by one fast, short link through the same shaper a run would use,
and times the worker transport moving a few large messages over four connections: the
forwarding cost (delay line, kernel, Python) that every emulated byte pays. The second
(testbed.emulator.runtime.coordinator.calibrate) runs a small pipeline of stage runners
in this process.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from testbed.common.codec import JsonObject
from testbed.common.fsutil import write_atomic
from testbed.common.jsonio import loads
from testbed.common.trust import Untrusted, owned_folder, read_owned
from testbed.emulator.net.network import bring_up, tear_down
from testbed.emulator.runtime.coordinator.calibrate import measure_worker_costs
from testbed.emulator.runtime.coordinator.probe import timed_messages
from testbed.errors import InputError, TestbedWarning
from testbed.run.dilation import WorkerCosts
from testbed.topology import parse_topology

ENV_DIR = "TESTBED_CAPACITY_DIR"
"""Where the figures are kept, an absolute folder (default DEFAULT_DIR). `TESTBED_CACHE`
once named it as well as the planning store's switch (testbed.common.memo), so that
`TESTBED_CACHE=off` made a folder `./off/`: it is not read here any more."""
DEFAULT_DIR = Path("/var/cache/testbed")
FILE = "capacity.json"
LARGEST = 64 * 1024
"""Bytes of the largest cache file read (it holds a few figures)."""
PLAUSIBLE: dict[str, tuple[float, float]] = {
    "bps": (1e6, 1e13),
    "span_cpu_s": (1e-7, 0.1),
    "idle_worker_cpu": (1e-6, 1.0),
}
"""The range a figure read back must lie in to be used, else it is measured again: a
machine forwards between 1 Mbit/s and 10 Tbit/s through one emulated link, a span costs
between 0.1 us and 0.1 s of CPU, an idle worker between a millionth of a core and a
whole one. A figure outside (1e-300, Infinity, NaN) would set the dilation to 64 or 1
whatever the plan."""
PROBE_BYTES = 64 * 2**20
PROBE_MESSAGES = 3
PROBE_CONNECTIONS = 4
_warned: set[str] = set()


def cache_file() -> Path:
    """The cache file: `$TESTBED_CAPACITY_DIR/capacity.json`, else DEFAULT_DIR's."""
    named = os.environ.get(ENV_DIR)
    if not named:
        return DEFAULT_DIR / FILE
    folder = Path(named).expanduser()
    if not folder.is_absolute():
        raise InputError(f"{named!r} is not an absolute path", ENV_DIR)
    return folder / FILE


def _key() -> str:
    return f"{platform.release()} cpus={os.cpu_count()}"


def _cached() -> JsonObject:
    """This machine's cached figures, raw as read (`_figure` checks each one; none from
    another kernel or core count, nor from a file someone else could have written:
    testbed.common.trust)."""
    path = cache_file()
    try:
        owned_folder(path.parent)
        text = read_owned(path, LARGEST)
        data = loads(text) if text is not None else {}
    except Untrusted as error:
        _warn(path, str(error))
        return {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) and data.get("machine") == _key() else {}


def _figure(name: str) -> float | None:
    """A cached figure in its PLAUSIBLE range, else None (measured again)."""
    value = _cached().get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    low, high = PLAUSIBLE[name]
    return float(value) if low <= value <= high else None  # NaN is in no range


def _remember(**figures: float | str) -> None:
    """Kept only in a folder that is trusted when read back."""
    path = cache_file()
    data = {**_cached(), "machine": _key(), **figures}
    try:
        folder = owned_folder(path.parent, make=True)
    except Untrusted as error:
        _warn(path, str(error))
        return
    write_atomic(folder / path.name, json.dumps(data), 0o644)


def _warn(path: Path, why: str) -> None:
    """Once per file and reason."""
    if f"{path}{why}" not in _warned:
        _warned.add(f"{path}{why}")
        warnings.warn(f"{path}: not using this machine's cached capacity figures (not "
                      f"trusted: {why}); measuring them", TestbedWarning, stacklevel=3)


def machine_capacity_bps(say: Callable[[str], None] = lambda _m: None) -> float:
    """Bits per second this machine moves through one emulated link (cached per kernel
    and core count)."""
    cached = _figure("bps")
    if cached is not None:
        return cached
    say("measuring what this machine can forward (once; cached in "
        f"{cache_file()})")
    bps = _probe()
    _remember(bps=bps, measured=time.strftime("%Y-%m-%dT%H:%M:%S"))
    return bps


def worker_costs(say: Callable[[str], None] = lambda _m: None) -> WorkerCosts:
    """CPU per span a worker records and per idle worker (cached per kernel and core
    count)."""
    span, idle = _figure("span_cpu_s"), _figure("idle_worker_cpu")
    if span is not None and idle is not None:
        return WorkerCosts(span, idle)
    say("measuring what this machine's CPU pays per worker action (once; cached in "
        f"{cache_file()})")
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
