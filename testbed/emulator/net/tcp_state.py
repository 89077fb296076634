"""The TCP connections of the emulated network's hosts as their kernels hold them (`ss -tin`):
each one's window, slow-start threshold and retransmissions. A real connection keeps the
threshold its losses (or CUBIC's HyStart) set for the rest of its life, and every slow
start after an idle stops there; a run records where its WAN connections ended up, so
that a difference from the simulator, whose pairs keep a threshold only where a full
queue's losses set one (testbed.sim.flows.Pair.cut), can be told from the run's own
results."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

_FIELD = re.compile(r"\b([a-z_]+):([0-9][0-9./]*)")


@dataclass(frozen=True)
class SocketState:
    """One established TCP socket, as the side that holds it sees it."""

    local: str
    """Its local address (no port)."""
    peer: str
    congestion: str
    min_rtt_s: float | None
    cwnd: int
    """Segments."""
    ssthresh: int | None
    """Segments; None where it never left slow start."""
    retransmitted: int
    """Segments sent again over its life."""
    bytes_sent: int


def _address(endpoint: str) -> str:
    """`10.64.0.12:42534`, `[::ffff:10.64.0.12]:42534` or `[fd00::1]:80` without its port
    (an IPv4-mapped address as IPv4)."""
    host = endpoint.rsplit(":", 1)[0].strip("[]")
    return host.removeprefix("::ffff:")


def parse_ss(text: str) -> list[SocketState]:
    """`ss -tinH state established`: a line per socket (queues, local and peer address)
    and, indented under it, its TCP information."""
    out: list[SocketState] = []
    endpoints: tuple[str, str] | None = None
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            words = line.split()
            endpoints = (_address(words[2]), _address(words[3])) if len(words) >= 4 else None
            continue
        if endpoints is None:
            continue
        words = line.split()
        fields = dict(_FIELD.findall(line))
        retrans = fields.get("retrans", "0/0").split("/")
        minrtt = fields.get("minrtt")
        out.append(SocketState(
            endpoints[0], endpoints[1],
            words[0] if words and ":" not in words[0] else "unknown",
            float(minrtt) / 1e3 if minrtt else None, int(fields.get("cwnd", "0")),
            int(fields["ssthresh"]) if "ssthresh" in fields else None,
            int(retrans[-1]), int(fields.get("bytes_sent", "0"))))
        endpoints = None
    return out


def socket_states(netns: str) -> list[SocketState]:
    """The established TCP sockets of namespace `netns` (none where `ss` fails)."""
    try:
        done = subprocess.run(["ip", "netns", "exec", netns, "ss", "-tinH", "state",
                               "established"], capture_output=True, text=True, timeout=10,
                              check=True)
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_ss(done.stdout)

