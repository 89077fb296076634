"""What TCP delivers of a link, as the simulator models it; in one neutral place so that
policies estimating transfer times use the very figures the simulator runs on."""

from __future__ import annotations

from dataclasses import dataclass

MSS = 1448
PAYLOAD_EFFICIENCY = MSS / 1500
"""TCP payload per byte a link carries (the shapers count IP bytes)."""
WINDOW_EFFICIENCY = 0.85
"""Share of tcp_wmem's maximum one flow keeps in flight; measured on this kernel:
0.287 Gbit/s for one flow at 100 ms RTT with a 4 MiB buffer (scripts/bench_net.py)."""


RESERVED_FILES = 64
"""Open files a worker keeps for everything but its pipeline connections."""


@dataclass(frozen=True)
class HostLimits:
    """What a host lets one worker's connections use. The defaults are Linux's own where it
    has one: a process may raise its open-file limit to the hard RLIMIT_NOFILE (4096 unless
    configured); TCP memory (`net.ipv4.tcp_mem`) scales with the host's RAM, so it has no
    default and does not bound unless given."""

    open_files: int = 4096
    """Open files a worker may hold (the hard RLIMIT_NOFILE): each connection is one."""
    tcp_memory_bytes: int | None = None
    """Where `net.ipv4.tcp_mem` puts TCP under memory pressure (its middle value)."""

    def connections_per_peer(self, send_buffer_bytes: int, peers: int = 2) -> int:
        """Most connections to each of `peers` neighbours: each is one open file, and each
        can fill its send buffer (receive buffers drain: the worker always reads)."""
        by_files = (self.open_files - RESERVED_FILES) // peers
        if self.tcp_memory_bytes is None:
            return max(1, by_files)
        by_memory = self.tcp_memory_bytes // (peers * max(1, send_buffer_bytes))
        return max(1, min(by_files, by_memory))

    def describe(self, send_buffer_bytes: int) -> str:
        """What sets `connections_per_peer`, in words."""
        files = f"an open-file limit of {self.open_files:,}"
        if self.tcp_memory_bytes is None:
            return files
        return (f"{files}, TCP memory under pressure past {self.tcp_memory_bytes:,} bytes "
                f"with send buffers of {send_buffer_bytes:,}")
