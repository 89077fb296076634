"""What a run has created, on disk before it is created, so `testbed down` can undo a
killed run. One JSON file per run under /run/testbed (tmpfs: gone with a reboot, as are
namespaces; TESTBED_STATE_DIR names another folder). Files are written atomically with
owner-only permissions.

A file is read for the keys this version knows, each checked for its type; others (a
later version's) are ignored. One that still does not read (damaged, or a version that
changed a known key) is kept apart with what of it does read (`DamagedState`): `down`
undoes that much only once its owner is provably gone (testbed.emulator.net.cleanup)."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from testbed.common.codec import JsonObject
from testbed.common.fsutil import write_atomic
from testbed.common.jsonio import read_json
from testbed.common.owners import STATE_DIR, process_start_ticks
from testbed.errors import InputError

SCHEMA = 1


@dataclass
class ProcessRecord:
    pid: int
    start_ticks: int
    role: str


class NodeListing(TypedDict):
    name: str
    dc: str
    address: str
    netns: str


class RouterListing(TypedDict):
    dc: str
    address: str
    netns: str
    subnet: str


class LinkListing(TypedDict):
    between: list[str]
    latency_ms: float
    bandwidth_bps: float
    jitter_ms: float
    loss: float
    queue_bytes: int
    shaper: str


class MachineListing(TypedDict):
    name: str
    address: str
    dcs: list[str]


class TunnelListing(TypedDict):
    dc: str
    peer: str
    vni: int
    remote: str


class ClusterListing(TypedDict):
    """The cluster a machine's share of a network belongs to (share.describe_cluster)."""

    name: str
    machine: str | None
    coordinator: str
    mtu: int
    machines: list[MachineListing]
    tunnels: list[TunnelListing]


class NetInfo(TypedDict, total=False):
    """A state file's `info`: what teardown needs (the host's congestion controls before
    ours, a launch's cgroup) and, once the network is up, its `net ls --json` listing
    (network.Network.describe)."""

    allowed_cc_before: str
    launch: bool
    cgroup: str
    run_id: str
    topology: str
    shaper: str
    slot: int
    nodes: list[NodeListing]
    routers: list[RouterListing]
    links: list[LinkListing]
    tcp: dict[str, dict[str, str]]
    notes: list[str]
    cluster: ClusterListing


@dataclass
class RunState:
    run_id: str
    slot: int
    prefix: str
    topology: str
    shaper: str
    namespaces: list[str]
    etc_dirs: list[str]
    owner_pid: int
    owner_ticks: int = 0
    created: float = field(default_factory=time.time)
    processes: list[ProcessRecord] = field(default_factory=list)
    detached: bool = False
    ready: bool = False
    info: NetInfo = field(default_factory=NetInfo)
    """What `testbed net ls` shows: nodes, links, shaper, notes."""

    @property
    def path(self) -> Path:
        return STATE_DIR / f"{self.run_id}.json"

    def save(self) -> None:
        data = asdict(self)
        data["schema"] = SCHEMA
        write_atomic(self.path, json.dumps(data, indent=1, sort_keys=True))

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    @classmethod
    def load(cls, path: Path) -> RunState:
        """The run in `path`; InputError where it does not read as one (DamagedState
        says what of it does)."""
        data = read_json(path, follow=False)
        if not isinstance(data, dict):
            raise InputError("not a JSON object", str(path))
        fields = _known_fields(data, str(path))
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in fields and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise InputError(f"no {missing[0]!r}", str(path))
        if fields["run_id"] != path.stem:
            raise InputError(f"names run {fields['run_id']!r}, not its own", str(path))
        return cls(**fields)


@dataclass(frozen=True)
class DamagedState:
    """A state file that does not read as a run's: what of it does (`salvaged`: each
    known key that has its type, the run id from the file's name, the rest empty)."""

    path: Path
    problem: str
    salvaged: RunState
    owner_known: bool
    """Whether it names its owner's pid (the start time may be missing)."""

    def owner_gone(self) -> bool:
        """Provably: it names its owner, and no process with that pid (and start time,
        where recorded) runs."""
        return self.owner_known and not owner_alive(self.salvaged)


def _names(value: Any) -> list[str]:
    if not (isinstance(value, list) and all(valid_name(v) for v in value)):
        raise ValueError("expected a list of names")
    return list(value)


def _strings(value: Any) -> list[str]:
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise ValueError("expected a list of strings")
    return list(value)


def _count(least: int) -> Any:
    def check(value: Any) -> int:
        if type(value) is not int or value < least:
            raise ValueError(f"expected a whole number from {least}")
        return value
    return check


def _of(kind: type) -> Any:
    def check(value: Any) -> Any:
        if type(value) is not kind and not (kind is float and type(value) is int):
            raise ValueError(f"expected {kind.__name__}")
        return value
    return check


def _processes(value: Any) -> list[ProcessRecord]:
    if not isinstance(value, list):
        raise ValueError("expected a list")
    return [_process(item) for item in value]


def _process(item: Any) -> ProcessRecord:
    if not isinstance(item, dict):
        raise ValueError("expected a mapping")
    try:
        return ProcessRecord(_count(1)(item["pid"]), _count(0)(item["start_ticks"]),
                             _of(str)(item["role"]))
    except KeyError as exc:
        raise ValueError(f"a process without {exc}") from None


def _readable_processes(value: Any) -> list[ProcessRecord]:
    """Of a damaged file: the records that read (one that does not is never matched
    to a process)."""
    out = []
    for item in value if isinstance(value, list) else ():
        with contextlib.suppress(ValueError):
            out.append(_process(item))
    return out


_KNOWN = {"run_id": _of(str), "slot": _count(0), "prefix": _of(str), "topology": _of(str),
          "shaper": _of(str), "namespaces": _names, "etc_dirs": _strings,
          "owner_pid": _count(1), "owner_ticks": _count(0), "created": _of(float),
          "processes": _processes, "detached": _of(bool), "ready": _of(bool),
          "info": _of(dict)}
"""What each known key of a state file takes: a pid is never 0 or negative (a signal to
one would go to a process group, or to every process)."""


def _known_fields(data: JsonObject, source: str | None = None) -> JsonObject:
    """The known keys of a state file's raw data, checked; unknown ones left out. With a
    `source`, a known key that does not have its type is an InputError naming it;
    without, it is left out."""
    out = {}
    for key, check in _KNOWN.items():
        if key in data:
            try:
                out[key] = check(data[key])
            except ValueError as exc:
                if source is not None:
                    raise InputError(str(exc), source, key) from None
    return out


def valid_name(name: object) -> bool:
    """Whether `name` can be a namespace's (one file name under /run/netns or
    /etc/netns): never a path, `.` or `..`."""
    return (isinstance(name, str) and 0 < len(name) <= 255 and "/" not in name
            and "\0" not in name and name not in (".", ".."))


def _salvaged(path: Path, problem: str) -> DamagedState:
    try:
        data = read_json(path, follow=False)
    except InputError:
        data = None
    fields = _known_fields(data) if isinstance(data, dict) else {}
    state = RunState(run_id=path.stem, slot=fields.get("slot", -1),
                     prefix=fields.get("prefix", ""), topology=fields.get("topology", "?"),
                     shaper=fields.get("shaper", "?"), namespaces=fields.get("namespaces", []),
                     etc_dirs=fields.get("etc_dirs", []), owner_pid=fields.get("owner_pid", 0),
                     owner_ticks=fields.get("owner_ticks", 0), created=fields.get("created", 0.0),
                     processes=_readable_processes(data.get("processes") if isinstance(
                         data, dict) else None))
    return DamagedState(path, problem, state, "owner_pid" in fields)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


@contextlib.contextmanager
def state_lock() -> Iterator[None]:
    """Serializes slot choice between concurrent runs on this machine."""
    STATE_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    with open(STATE_DIR / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_states() -> tuple[list[RunState], list[DamagedState]]:
    """Every state file: the runs, and those that do not read as one."""
    states: list[RunState] = []
    damaged: list[DamagedState] = []
    if not STATE_DIR.is_dir():
        return states, damaged
    for path in sorted(STATE_DIR.glob("*.json")):
        try:
            states.append(RunState.load(path))
        except InputError as exc:
            damaged.append(_salvaged(path, f"{exc.key}: {exc.problem}" if exc.key
                                     else exc.problem))
    return states, damaged


def all_states() -> list[RunState]:
    return read_states()[0]


def damaged_states() -> list[DamagedState]:
    return read_states()[1]


def damaged_state_files() -> list[Path]:
    return [d.path for d in damaged_states()]


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of a process (R, S, D, T for stopped, Z...), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(record: ProcessRecord) -> bool:
    return process_start_ticks(record.pid) == record.start_ticks


def owner_alive(state: RunState) -> bool:
    """Whether the process that made this run is still the one running under its pid
    (a file that does not record its start time: whether any process has that pid)."""
    ticks = process_start_ticks(state.owner_pid)
    return ticks is not None and (state.owner_ticks in (0, ticks))


PROBE_PREFIX = "tb.probe-"
"""Scratch namespaces (a netem probe) are named `tb.probe-<pid>-<start ticks>` of the
process that made them: the dot is in no name a topology can give (DC names are letters
and digits), and the owner in the name is the probe's whole state, so `testbed down`
removes one only once its maker is gone."""


def probe_namespace() -> str:
    """A scratch namespace's name for this process."""
    pid = os.getpid()
    return f"{PROBE_PREFIX}{pid}-{process_start_ticks(pid) or 0}"


def stale_probe(name: str) -> bool:
    """Whether `name` is a scratch namespace whose maker has exited."""
    owner = name.removeprefix(PROBE_PREFIX)
    pid, _, ticks = owner.partition("-")
    if owner == name or not (pid.isdigit() and ticks.isdigit()):
        return False
    return process_start_ticks(int(pid)) != int(ticks)
