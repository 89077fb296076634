"""What each WAN link direction carried, from the shaper's own counters sampled over time
(a launched program sends what it sends; nothing records its messages). Pure: samples in,
totals and rates out.

The shaper counts what it sends on: IP packets, each with its headers, retransmissions
and the receiver's ACKs included. What a testbed run calls `wan.bytes` is its messages'
bytes, TCP's payload; a packet's payload is its length less its headers, so the payload
is the bytes less `packets x HEADER_BYTES` (IPv4 20 and TCP 32 with the timestamps Linux
sends by default; plus the link layer's 14 where the shaper sits on an Ethernet device).
A pure ACK is then zero payload, as it is; SACK options make a few ACKs longer, so the
estimate can be high by their options' bytes, and retransmitted payload counts again (it
crossed the WAN twice)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

IP_TCP_HEADER_BYTES = 52
"""IPv4 (20) and TCP with the timestamps option (32) of every segment."""
ETHERNET_HEADER_BYTES = 14


@dataclass(frozen=True)
class Counter:
    """One direction's counters at one time (seconds since the launch started)."""

    t: float
    bytes: int
    packets: int
    drops: int


@dataclass(frozen=True)
class DirectionUse:
    """One direction over the launch: totals, and its rate in each sampling interval."""

    link: str
    rate_bps: float
    wire_bytes: int
    payload_bytes: int
    packets: int
    drops: int
    times: list[float]
    """The middle of each interval between two samples."""
    bps: list[float]
    """Wire bits per second in each interval."""

    @property
    def peak_bps(self) -> float | None:
        return max(self.bps) if self.bps else None

    def peak_utilization(self) -> float | None:
        peak = self.peak_bps
        return None if peak is None or self.rate_bps <= 0 else peak / self.rate_bps

    def mean_utilization(self, length_s: float) -> float | None:
        if self.rate_bps <= 0 or length_s <= 0:
            return None
        return self.wire_bytes * 8 / (self.rate_bps * length_s)


def payload(wire_bytes: int, packets: int, link_header: int = 0) -> int:
    """TCP payload in `wire_bytes` of `packets` packets (the module's docstring says how)."""
    return max(0, wire_bytes - packets * (IP_TCP_HEADER_BYTES + link_header))


def direction_use(link: str, samples: Sequence[Counter], rate_bps: float,
                  link_header: int = 0) -> DirectionUse:
    """A direction's use from its samples in time order (counters only grow; the first
    sample is the baseline)."""
    if not samples:
        return DirectionUse(link, rate_bps, 0, 0, 0, 0, [], [])
    first, last = samples[0], samples[-1]
    wire = last.bytes - first.bytes
    packets = last.packets - first.packets
    times, bps = [], []
    for before, after in itertools.pairwise(samples):
        gap = after.t - before.t
        if gap > 0:
            times.append((before.t + after.t) / 2)
            bps.append((after.bytes - before.bytes) * 8 / gap)
    return DirectionUse(link, rate_bps, wire, payload(wire, packets, link_header), packets,
                        last.drops - first.drops, times, bps)


def total_utilization(uses: Sequence[DirectionUse], length_s: float) -> float | None:
    """Bytes every direction that carried traffic moved over what they could have moved
    in the launch's length (as a testbed run's `wan.utilization` counts the directions
    its plan uses)."""
    used = [u for u in uses if u.wire_bytes > 0 and u.rate_bps > 0]
    capacity = sum(u.rate_bps for u in used) * length_s
    return sum(u.wire_bytes for u in used) * 8 / capacity if capacity > 0 else None


def utilization_series(uses: Sequence[DirectionUse]) -> Mapping[str, list[float]]:
    """Each direction's share of its rate in each interval (for the WAN plot)."""
    return {u.link: [b / u.rate_bps if u.rate_bps > 0 else 0.0 for b in u.bps] for u in uses}


def counted_at(samples: Sequence[Counter], t: float) -> tuple[float, float]:
    """A direction's (bytes, packets) counted by time `t`, on the straight line between
    the samples around it: exact where the link was idle between them (a program that
    waits before and after a phase it measures)."""
    if not samples or t <= samples[0].t:
        return (float(samples[0].bytes), float(samples[0].packets)) if samples else (0.0, 0.0)
    for before, after in itertools.pairwise(samples):
        if before.t <= t <= after.t:
            share = (t - before.t) / (after.t - before.t) if after.t > before.t else 1.0
            return (before.bytes + share * (after.bytes - before.bytes),
                    before.packets + share * (after.packets - before.packets))
    return float(samples[-1].bytes), float(samples[-1].packets)


def payload_between(samples: Sequence[Counter], t0: float, t1: float,
                    link_header: int = 0) -> int:
    """TCP payload a direction carried between `t0` and `t1` (see `counted_at`)."""
    b0, p0 = counted_at(samples, t0)
    b1, p1 = counted_at(samples, t1)
    return payload(round(b1 - b0), round(p1 - p0), link_header)
