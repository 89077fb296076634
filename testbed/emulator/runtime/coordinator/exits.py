"""Why a run's process ended, in words: its exit code, or the signal that killed it by
name, with the kernel's OOM killer told apart from any other SIGKILL.

The OOM killer's SIGKILL looks like every other. /proc/vmstat's `oom_kill` counts each
process the kernel has killed for memory (a cgroup's limit or the whole machine's), and
any user may read it, unlike the kernel log that names the victim. A process that died of
SIGKILL while that count rose is reported as killed for memory, with its resident size
when last sampled; without the count, or when it did not rise, as killed by SIGKILL.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from testbed.common.units import human_bytes

VMSTAT = Path("/proc/vmstat")
SAMPLE_S = 0.5
"""How often a watched process's resident memory is read."""


def oom_kills(vmstat: Path = VMSTAT) -> int | None:
    """Processes the kernel has killed for memory since boot; None where not counted."""
    try:
        for line in vmstat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return None


def resident_bytes(pid: int) -> int | None:
    """A live process's resident memory; None once it is gone."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE") if pages else None


def peak_resident_bytes(pid: int) -> int | None:
    """The most memory a live process has held resident so far (the kernel's high-water
    mark, VmHWM); None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def exit_reason(code: int, oom_before: int | None = None, oom_after: int | None = None,
                resident: int | None = None) -> str:
    """`exited with code 3`, `was killed by SIGSEGV (exit code -11)`, or, for a SIGKILL
    while the kernel's OOM-kill count rose, `was killed: out of memory (...)`."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    if (-code == signal.SIGKILL and oom_before is not None and oom_after is not None
            and oom_after > oom_before):
        size = f", {human_bytes(resident)} resident when last seen" if resident else ""
        return f"was killed: out of memory (the kernel's OOM killer{size})"
    return f"was killed by {name} (exit code {code})"
