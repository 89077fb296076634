"""What a killed sweep leaves, told apart from everything else on the machine.

A sweep marks what it starts with its own identity, the pid and start time of its
process (`MARK=PID-TICKS` in the environment, which every process started from it
inherits: its local workers and what they fork, a local Ray instance's processes and
their workers), and a local Ray instance's temporary folder holds the same in a file
(`OWNER_FILE`). `testbed down` removes what is marked by a sweep whose process is gone,
and nothing else: a live sweep's processes and folders are left alone, and so is
everything unmarked."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import tempfile
import time
from collections.abc import Container, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from testbed.common.owners import gone, identity, process_start_ticks

MARK = "TESTBED_SWEEP"
RAY_FOLDER = "TESTBED_SWEEP_RAY_TEMP"
"""The local Ray instance's temporary folder, in its processes' environment."""
RAY_PREFIX = "testbed-ray-"
OWNER_FILE = "testbed-sweep"
"""In a local Ray instance's temporary folder: the identity of the sweep that made it."""
GRACE_S = 5.0
"""How long SIGKILLed processes get to be gone, before their folders are removed."""


@contextlib.contextmanager
def marking(ray_folder: Path | None = None) -> Iterator[str]:
    """This process's mark (and a local Ray instance's folder) in the environment that
    processes started meanwhile inherit; the environment as it was afterwards."""
    mark = identity()
    values = {MARK: mark, RAY_FOLDER: str(ray_folder) if ray_folder else None}
    before = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            _set(key, value)
        yield mark
    finally:
        for key, value in before.items():
            _set(key, value)


def _set(key: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(key, None)
    else:
        os.environ[key] = value


def ray_folder() -> Path:
    """A new temporary folder for a local Ray instance, marked as this process's."""
    folder = Path(tempfile.mkdtemp(prefix=RAY_PREFIX))
    (folder / OWNER_FILE).write_text(identity())
    return folder


@dataclass
class Leftovers:
    processes: dict[int, int] = field(default_factory=dict)
    """pid -> start time, of processes marked by sweeps that are gone."""
    folders: list[Path] = field(default_factory=list)


def find(only: Container[str] | None = None) -> Leftovers:
    """Processes and Ray folders of sweeps that are gone (`only`: of these marks alone).
    A process is one by its mark or, where Ray wrote over its environment (it does, to
    make room for a process title), by a file it holds open for writing in such a
    folder (its logs)."""
    def wanted(mark: str | None) -> bool:
        return mark is not None and gone(mark) and (only is None or mark in only)

    found = Leftovers()
    others: list[tuple[int, int, Path]] = []
    named: set[Path] = set()
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        ticks = process_start_ticks(pid)
        if ticks is None:
            continue
        env = _environment(entry)
        if wanted(env.get(MARK)):
            found.processes[pid] = ticks
            if env.get(RAY_FOLDER):
                named.add(Path(env[RAY_FOLDER]))
        else:
            others.append((pid, ticks, entry))
    for base in {Path(tempfile.gettempdir()), Path("/tmp")}:
        with contextlib.suppress(OSError):
            named |= set(base.glob(f"{RAY_PREFIX}*"))
    found.folders = sorted(f for f in named if wanted(_owner(f)))
    inside = tuple(f"{folder}/" for folder in found.folders)
    for pid, ticks, entry in others if inside else ():
        if any(path.startswith(inside) for path in _writing(entry)):
            found.processes[pid] = ticks
    return found


def _environment(entry: Path) -> dict[str, str]:
    try:
        raw = (entry / "environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, _, v in pairs
            if k in (MARK.encode(), RAY_FOLDER.encode())}


def _writing(entry: Path) -> Iterator[str]:
    """The files a process holds open for writing."""
    with contextlib.suppress(OSError):
        for fd in (entry / "fd").iterdir():
            with contextlib.suppress(OSError, ValueError, IndexError):
                flags = (entry / "fdinfo" / fd.name).read_text().split("flags:")[1].split()[0]
                if int(flags, 8) & (os.O_WRONLY | os.O_RDWR):
                    yield os.readlink(fd)


def _owner(folder: Path) -> str | None:
    """The mark in a Ray folder of ours: a real folder (never a link) named as ours,
    holding the file."""
    try:
        if not (folder.name.startswith(RAY_PREFIX) and stat.S_ISDIR(os.lstat(folder).st_mode)):
            return None
        fd = os.open(folder / OWNER_FILE, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return handle.read(64).decode(errors="replace").strip()


def remove(found: Leftovers) -> list[str]:
    """SIGKILL the processes (each only while it is still the process found) and remove
    the folders; what could not be removed, in words."""
    problems = []
    for pid, ticks in found.processes.items():
        if process_start_ticks(pid) == ticks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + GRACE_S  # gone before their folders go
    while any(process_start_ticks(p) == t for p, t in found.processes.items()) and \
            time.monotonic() < deadline:
        time.sleep(0.02)
    for folder in found.folders:
        try:
            shutil.rmtree(folder)
        except FileNotFoundError:
            pass
        except OSError as exc:
            problems.append(f"sweep folder {folder}: {exc.strerror or exc}")
    return problems
