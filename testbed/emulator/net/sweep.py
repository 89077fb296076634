"""Every process a run started inside its namespaces, found however it left its parent
(`testbed launch`'s ranks and whatever they start): a cgroup v2
group per rank where the machine has the cgroup2 file system (a process cannot leave its
cgroup by forking, `setsid` or double-forking; `cgroup.kill` ends all of it at once, and
`cpu.stat` counts all of its CPU), and always a sweep of the launch's namespaces (every
process whose network namespace is one of them) as the last word at teardown."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

from testbed.emulator.net.netns import NETNS_DIR

MOUNTINFO = Path("/proc/self/mountinfo")
GROUP_PREFIX = "testbed-launch-"


def cgroup2_mount(mountinfo: Path = MOUNTINFO) -> Path | None:
    """Where the cgroup2 file system is mounted (`/sys/fs/cgroup`, or `.../unified` on a
    hybrid machine), if it is and we may make groups there."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        before, _, after = line.partition(" - ")
        if after.split(" ")[:1] == ["cgroup2"]:
            mount = Path(before.split(" ")[4])
            if os.access(mount, os.W_OK) and (mount / "cgroup.procs").exists():
                return mount
    return None


class RankGroups:
    """One cgroup per rank under `<mount>/testbed-launch-<run id>`, or (`root` None)
    nothing: then a rank is its process group and the descendants of its process."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    @classmethod
    def make(cls, run_id: str) -> RankGroups:
        mount = cgroup2_mount()
        if mount is None:
            return cls(None)
        root = mount / f"{GROUP_PREFIX}{run_id}"
        try:
            root.mkdir(mode=0o755)
        except OSError:
            return cls(None)
        return cls(root)

    def procs_file(self, name: str) -> Path | None:
        """The file a rank's first process writes its pid into (joining its group)."""
        if self.root is None:
            return None
        group = self.root / name
        group.mkdir(exist_ok=True)
        return group / "cgroup.procs"

    def pids(self, name: str, pid: int | None = None) -> list[int]:
        """The rank's live processes: its group's (nested groups too), or `pid`'s
        descendants and `pid`."""
        if self.root is not None:
            return group_pids(self.root / name)
        return [] if pid is None else descendants(pid)

    def cpu_s(self, name: str) -> float | None:
        """CPU seconds every process of the rank's group used, the exited ones too."""
        if self.root is None:
            return None
        try:
            for line in (self.root / name / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
        return None

    def signal(self, name: str, signum: int, pid: int | None = None) -> None:
        """`signum` to every process of the rank (SIGKILL through cgroup.kill, at once)."""
        if self.root is not None and signum == signal.SIGKILL:
            with contextlib.suppress(OSError):
                (self.root / name / "cgroup.kill").write_text("1")
        targets = set(self.pids(name, pid))
        if pid is not None:
            with contextlib.suppress(OSError):
                os.killpg(pid, signum)  # its process group (the rank's own session)
        send(targets, signum)

    def remove(self) -> list[str]:
        """Every group gone (each killed first if something is left in it)."""
        if self.root is None:
            return []
        return remove_group(self.root)


def remove_group(root: Path) -> list[str]:
    """Kill what is left in a launch's groups and remove them; what could not be."""
    problems: list[str] = []
    if not root.is_dir():
        return problems
    groups = sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts))
    for group in [*groups, root]:
        with contextlib.suppress(OSError):
            (group / "cgroup.kill").write_text("1")
    for group in [*groups, root]:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.02)  # the killed are still exiting
        else:
            problems.append(f"cgroup {group} could not be removed")
    return problems


def group_pids(group: Path) -> list[int]:
    pids: list[int] = []
    for procs in [group / "cgroup.procs", *group.rglob("*/cgroup.procs")]:
        with contextlib.suppress(OSError, ValueError):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def _parents() -> dict[int, int]:
    out: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                out[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return out


def descendants(pid: int) -> list[int]:
    """`pid` and every live process below it."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        one = todo.pop()
        if Path(f"/proc/{one}").exists():
            found.append(one)
        todo += children.get(one, [])
    return found


def in_namespaces(names: Iterable[str]) -> list[int]:
    """Every process (but this one) whose network namespace is one of `names`."""
    wanted = set()
    for name in names:
        with contextlib.suppress(OSError):
            st = (NETNS_DIR / name).stat()
            wanted.add((st.st_dev, st.st_ino))
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        with contextlib.suppress(OSError):
            st = (entry / "ns" / "net").stat()
            if (st.st_dev, st.st_ino) in wanted:
                found.append(int(entry.name))
    return found


def send(pids: Iterable[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def sweep_namespaces(names: Iterable[str], grace_s: float = 2.0) -> list[int]:
    """SIGTERM every process left in the namespaces, SIGKILL what is there after
    `grace_s`; the pids found."""
    names = list(names)
    found = in_namespaces(names)
    send(found, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while found and time.monotonic() < deadline:
        time.sleep(0.05)
        if not in_namespaces(names):
            return found
    left = in_namespaces(names)
    send(left, signal.SIGKILL)
    return sorted(set(found) | set(left))
