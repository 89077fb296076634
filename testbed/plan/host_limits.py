"""The limits of the machine that runs the workers, read once for planning: its hard
open-file limit and where its kernel puts TCP under memory pressure; and the memory it
has available, read each time it is asked (an emulated run checks its predicted memory
against it, a sweep sizes its pool of workers by it)."""

from __future__ import annotations

import functools
import os
import resource
from pathlib import Path

from testbed.plan.tcp_model import HostLimits

TCP_MEM = Path("/proc/sys/net/ipv4/tcp_mem")


@functools.cache
def this_machine() -> HostLimits:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = hard if hard != resource.RLIM_INFINITY else 1 << 20
    try:
        pressure_pages = int(TCP_MEM.read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return HostLimits(open_files=files)
    return HostLimits(open_files=files,
                      tcp_memory_bytes=pressure_pages * os.sysconf("SC_PAGE_SIZE"))


def available_memory(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """What the kernel says can be allocated without swapping (MemAvailable)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None
