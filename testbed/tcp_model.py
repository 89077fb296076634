"""What TCP delivers of a link, as the simulator models it; in one neutral place so that
policies estimating transfer times use the very figures the simulator runs on."""

from __future__ import annotations

MSS = 1448
PAYLOAD_EFFICIENCY = MSS / 1500
"""TCP payload per byte a link carries (the shapers count IP bytes)."""
WINDOW_EFFICIENCY = 0.85
"""Share of tcp_wmem's maximum one flow keeps in flight; measured on this kernel:
0.287 Gbit/s for one flow at 100 ms RTT with a 4 MiB buffer (scripts/bench_net.py)."""
