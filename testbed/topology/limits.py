"""What both backends can do with a link: the bounds every rate and delay is checked
against, in topology files and network events alike; and how many runs one host holds."""

from __future__ import annotations

from testbed.common.fields import bounded, positive
from testbed.common.units import format_duration, format_rate, parse_duration, parse_rate

# What both backends can do: rates from 1 Mbit/s (slower links make a tiny message last
# minutes and the kernel's rate tables coarse; the shapers' upper limits are checked when
# a network comes up) and delays up to 10 s one way (netem counts in 32-bit ticks).
MIN_RATE_BPS, MAX_RATE_BPS = 1e6, 1e15
MAX_LATENCY_S = 10.0
RATE = bounded(parse_rate, MIN_RATE_BPS, MAX_RATE_BPS, format_rate)
WAN_LATENCY = bounded(positive(parse_duration), 0.0, MAX_LATENCY_S, format_duration)
DC_LATENCY = bounded(parse_duration, 0.0, MAX_LATENCY_S, format_duration)

# Runs one host holds at once: slot k takes the address block 10.(64 + k).0.0/16 (net.layout).
MAX_SLOTS = 64
