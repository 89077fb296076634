"""What a run has created, on disk before it is created, so `testbed down` can undo a
killed run. One JSON file per run under /run/testbed (tmpfs: gone with a reboot, as are
namespaces). Files are written atomically with owner-only permissions."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from testbed.common.fsutil import write_atomic
from testbed.common.jsonio import read_json
from testbed.errors import InputError

STATE_DIR = Path(os.environ.get("TESTBED_STATE_DIR", "/run/testbed"))
SCHEMA = 1


@dataclass
class ProcessRecord:
    pid: int
    start_ticks: int
    role: str


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
    info: dict[str, Any] = field(default_factory=dict)
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
        data = read_json(path, follow=False)
        data.pop("schema", None)
        data["processes"] = [ProcessRecord(**p) for p in data.get("processes", [])]
        return cls(**data)


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


def all_states() -> list[RunState]:
    states: list[RunState] = []
    if not STATE_DIR.is_dir():
        return states
    for path in sorted(STATE_DIR.glob("*.json")):
        try:
            states.append(RunState.load(path))
        except (InputError, TypeError, KeyError, AttributeError):
            continue  # a damaged file names nothing we can trust; `down` reports it
    return states


def damaged_state_files() -> list[Path]:
    good = {s.path for s in all_states()}
    return (
        [p for p in sorted(STATE_DIR.glob("*.json")) if p not in good] if STATE_DIR.is_dir() else []
    )


def process_start_ticks(pid: int) -> int | None:
    """A live process's start time in clock ticks, to tell it from a later one with the same
    pid; None once it has exited."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None  # exited; only waiting to be reaped
    return int(fields[19])


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of a process (R, S, D, T for stopped, Z...), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def alive(record: ProcessRecord) -> bool:
    return process_start_ticks(record.pid) == record.start_ticks


def owner_alive(state: RunState) -> bool:
    """Whether the process that made this run is still the one running under its pid."""
    return process_start_ticks(state.owner_pid) == state.owner_ticks


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
