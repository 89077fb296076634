"""Which qdiscs shape which interface, as plain data (Mininet style): built here, applied in
one place by the namespace code.

Two shapers sit behind one interface:

- `netem`: htb for the rate, a netem child for delay, jitter and loss, its limit at least
  the bandwidth-delay product in packets (netem's default of 1000 caps throughput);
- `userspace`: tbf for the rate and a byte-sized drop-tail queue in the kernel, on a TUN
  device whose reader (the delay line) adds propagation delay, jitter without reordering,
  and loss, then writes packets back to be routed on. Queueing happens before the delay,
  as on a real link, and TCP stays end to end.

Host links get htb for their rate under both shapers (and netem for intra-DC latency where
netem exists). Rates go to the kernel as integers of bytes per second, tc's ratespec unit,
never as tc's text units (where `mbps` means megabytes per second).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from testbed.emulator.net.layout import DEFAULT_MTU, Layout, Shape
from testbed.errors import NetworkError


class Shaper(StrEnum):
    NETEM = "netem"
    USERSPACE = "userspace"


GSO_BYTES = 65536
NETEM_MIN_LIMIT = 1000


@dataclass(frozen=True)
class Qdisc:
    """One qdisc or class to add: `kind` is htb, htb-class, netem or tbf."""

    netns: str
    ifname: str
    kind: str
    handle: int
    parent: int | None
    params: dict[str, Any] = field(default_factory=dict)
    """pyroute2's tc keyword arguments for `kind` (rates, delays, handles)."""


@dataclass(frozen=True)
class DelayLineSpec:
    """A userspace delay line: the TUN it serves and what it does to each packet."""

    netns: str
    dc: str
    tun: str
    delay_s: float
    jitter_s: float
    loss: float
    seed: int


def htb_burst(rate_bps: float) -> int:
    """Enough tokens for a millisecond at line rate and two GSO super-packets."""
    return max(math.ceil(rate_bps / 8 / 1000), 2 * GSO_BYTES + DEFAULT_MTU)


def netem_limit(shape: Shape) -> int:
    """Packets netem must hold: everything in flight on the delay plus the queue."""
    in_flight = shape.rate_bps / 8 * (shape.delay_s + shape.jitter_s)
    return max(NETEM_MIN_LIMIT, math.ceil((in_flight + shape.queue_bytes) / DEFAULT_MTU))


TBF_MAX_BPS = (2**32 - 1) * 8
"""tbf's rate field is 32 bits of bytes per second (pyroute2 sends no 64-bit rate for tbf)."""


def _rate_class(netns: str, ifname: str, shape: Shape) -> list[Qdisc]:
    rate = int(shape.rate_bps / 8)
    burst = htb_burst(shape.rate_bps)
    return [
        Qdisc(netns, ifname, "htb", 0x10000, None, {"default": 1, "r2q": 1000}),
        Qdisc(
            netns,
            ifname,
            "htb-class",
            0x10001,
            0x10000,
            {
                "rate": rate,
                "ceil": rate,
                "burst": burst,
                "cburst": burst,
                "quantum": GSO_BYTES + DEFAULT_MTU,
            },
        ),
    ]


def netem_link(netns: str, ifname: str, shape: Shape) -> list[Qdisc]:
    """htb for the rate; netem below it for delay, jitter and loss (if any)."""
    ops = _rate_class(netns, ifname, shape)
    if shape.delay_s > 0 or shape.jitter_s > 0 or shape.loss > 0:
        ops.append(
            Qdisc(
                netns,
                ifname,
                "netem",
                0x100000,
                0x10001,
                {
                    "delay": shape.delay_s * 1e6,
                    "jitter": shape.jitter_s * 1e6,
                    "loss": shape.loss * 100,
                    "limit": netem_limit(shape),
                },
            )
        )
    return ops


def rate_only(netns: str, ifname: str, shape: Shape) -> list[Qdisc]:
    """htb alone: a host link where no delay is added in the kernel."""
    return _rate_class(netns, ifname, shape)


def tbf_queue(netns: str, ifname: str, shape: Shape) -> list[Qdisc]:
    """Rate and a byte-sized drop-tail queue in one tbf, in front of a delay line."""
    if shape.rate_bps > TBF_MAX_BPS:
        raise ValueError(
            f"{shape.rate_bps / 1e9:g} Gbit/s is above what tbf can shape "
            f"({TBF_MAX_BPS / 1e9:.0f} Gbit/s)"
        )
    return [
        Qdisc(
            netns,
            ifname,
            "tbf",
            0x10000,
            None,
            {
                "rate": int(shape.rate_bps / 8),
                "burst": htb_burst(shape.rate_bps),
                "limit": shape.queue_bytes + htb_burst(shape.rate_bps),
            },
        )
    ]


@dataclass(frozen=True)
class ShapingPlan:
    qdiscs: tuple[Qdisc, ...]
    delay_lines: tuple[DelayLineSpec, ...]
    notes: tuple[str, ...]


def plan_shaping(layout: Layout, shaper: Shaper, seed: int = 0) -> ShapingPlan:
    """Every qdisc and delay line the network needs under `shaper`."""
    qdiscs: list[Qdisc] = []
    lines: list[DelayLineSpec] = []
    notes: list[str] = []
    host_link = netem_link if shaper is Shaper.NETEM else rate_only
    for node in layout.nodes:
        router = layout.router(node.dc)
        qdiscs += host_link(node.netns, "eth0", node.uplink)
        qdiscs += host_link(router.netns, node.router_if, node.downlink)
    if shaper is Shaper.USERSPACE:
        skipped = sorted({n.dc for n in layout.nodes if n.uplink.delay_s * 2 > 1e-4})
        if skipped:
            notes.append(
                f"intra-DC latency of {', '.join(skipped)} not added by the userspace "
                "shaper (native veth latency applies); WAN latency is exact"
            )
    for i, port in enumerate(layout.ports):
        router = layout.router(port.dc)
        if shaper is Shaper.NETEM:
            qdiscs += netem_link(router.netns, port.ifname, port.out)
        else:
            try:
                qdiscs += tbf_queue(router.netns, port.tun, port.out)
            except ValueError as exc:
                raise NetworkError(
                    f"WAN link {port.dc} <-> {port.peer}: {exc}; lower its "
                    "bandwidth or use a host with netem"
                ) from None
            lines.append(
                DelayLineSpec(
                    router.netns,
                    port.dc,
                    port.tun,
                    port.out.delay_s,
                    port.out.jitter_s,
                    port.out.loss,
                    seed * 1000 + i,
                )
            )
    return ShapingPlan(tuple(qdiscs), tuple(lines), tuple(notes))
