"""The userspace delay line: propagation delay, jitter and loss where the kernel has no netem.

Runs inside a router namespace and serves that router's WAN TUN devices. The kernel routes
each packet bound for a peer DC into the TUN (after tbf has applied the rate and drop-tail
queue); this process reads it, holds it for the one-way delay, and writes it back
unchanged; a policy-routing rule sends packets leaving the TUN on to the peer. TCP is never
terminated, so one flow on a long link stays window-limited exactly as on a real WAN.

The TUNs carry GSO super-packets (virtio-net header, TSO offloads), so a 1 Gbit/s flow
costs a few thousand packets a second, not 80,000. Where loss is configured the TUN runs
without offloads so that loss hits single segments, as on a real link.

Timing: one thread, `select` with microsecond timeouts, SCHED_FIFO where permitted so a busy
machine does not delay releases. A packet is timestamped when read, so it is never released
early: measured delay is the configured delay plus a small positive bias.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import json
import os
import random
import select
import signal
import struct
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

TUNSETIFF = 0x400454CA
TUNSETOFFLOAD = 0x400454D0
TUNSETVNETHDRSZ = 0x400454D8
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
IFF_VNET_HDR = 0x4000
TUN_F_CSUM = 0x01
TUN_F_TSO4 = 0x02
TUN_F_TSO6 = 0x04
VNET_HDR_LEN = 10
READ_SIZE = 65536 + 256
READ_BATCH = 64
ORPHAN_CHECK_S = 0.5


@dataclass
class Port:
    """One TUN and what it does to the packets passing through it."""

    name: str
    delay_s: float
    jitter_s: float = 0.0
    loss: float = 0.0
    seed: int = 0
    fd: int = -1
    queue: collections.deque[tuple[float, bytes]] = field(default_factory=collections.deque)
    last_release: float = 0.0
    packets_in: int = 0
    bytes_in: int = 0
    packets_out: int = 0
    bytes_out: int = 0
    dropped: int = 0
    late_max_s: float = 0.0
    late_sum_s: float = 0.0
    rng: random.Random = field(default_factory=random.Random)

    @property
    def offloads(self) -> bool:
        """GSO super-packets, unless loss must hit single segments."""
        return self.loss == 0.0

    def release_time(self, now: float) -> float:
        """When a packet read at `now` leaves: delay plus jitter, never before the last one."""
        delay = self.delay_s
        if self.jitter_s:
            delay = max(0.0, delay + self.rng.uniform(-self.jitter_s, self.jitter_s))
        release = max(now + delay, self.last_release)
        self.last_release = release
        return release

    def stats(self) -> dict[str, float]:
        return {
            "packets_in": self.packets_in,
            "bytes_in": self.bytes_in,
            "packets_out": self.packets_out,
            "bytes_out": self.bytes_out,
            "dropped": self.dropped,
            "queued": len(self.queue),
            "late_max_ms": self.late_max_s * 1e3,
            "late_mean_ms": self.late_sum_s / self.packets_out * 1e3 if self.packets_out else 0.0,
        }


def open_tun(name: str, offloads: bool) -> int:
    """Attach to the TUN device `name` (created beforehand) in this namespace."""
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    flags = IFF_TUN | IFF_NO_PI | (IFF_VNET_HDR if offloads else 0)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), flags))
    if offloads:
        fcntl.ioctl(fd, TUNSETVNETHDRSZ, struct.pack("i", VNET_HDR_LEN))
    fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 if offloads else 0)
    return fd


def run(ports: list[Port], parent_pid: int, stats_path: Path | None,
        control_path: Path | None = None) -> None:
    def request_stop(*_: object) -> None:
        raise _Stop()

    def request_reload(*_: object) -> None:
        raise _Reload()

    def dump(*_: object) -> None:
        if stats_path is not None:
            write_stats(stats_path, ports)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGHUP, request_reload)
    with contextlib.suppress(_Stop):
        while True:
            try:
                _loop(ports, parent_pid)
                break
            except _Reload:
                if control_path is not None:
                    reload(ports, control_path)
    dump()


class _Reload(Exception):
    """SIGHUP: the link changed; read the new delay, jitter and loss."""


def reload(ports: list[Port], path: Path) -> None:
    """New settings for every port from a JSON file: delay_s, jitter_s, loss."""
    try:
        settings = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    for port in ports:
        port.delay_s = float(settings.get("delay_s", port.delay_s))
        port.jitter_s = float(settings.get("jitter_s", port.jitter_s))
        port.loss = float(settings.get("loss", port.loss))


class _Stop(Exception):
    """SIGTERM: leave the loop at once, even from inside select()."""


def _loop(ports: list[Port], parent_pid: int) -> None:
    """Release what is due, wait for the next release or packet, read, repeat."""
    by_fd = {port.fd: port for port in ports}
    fds = list(by_fd)
    clock = time.monotonic
    next_orphan_check = clock() + ORPHAN_CHECK_S
    while True:
        now = clock()
        timeout = ORPHAN_CHECK_S
        for port in ports:
            queue = port.queue
            while queue and queue[0][0] <= now:
                due, packet = queue.popleft()
                with contextlib.suppress(BlockingIOError):
                    os.write(port.fd, packet)
                    port.packets_out += 1
                    port.bytes_out += len(packet)
                late = now - due
                port.late_sum_s += late
                port.late_max_s = max(port.late_max_s, late)
                now = clock()
            if queue:
                timeout = min(timeout, queue[0][0] - now)
        if now >= next_orphan_check:
            next_orphan_check = now + ORPHAN_CHECK_S
            if parent_pid and os.getppid() != parent_pid:
                break  # the run that started us is gone; so are we
        readable = select.select(fds, [], [], max(timeout, 0.0))[0]
        for fd in readable:
            port = by_fd[fd]
            for _ in range(READ_BATCH):
                try:
                    packet = os.read(fd, READ_SIZE)
                except BlockingIOError:
                    break
                port.packets_in += 1
                port.bytes_in += len(packet)
                if port.loss and port.rng.random() < port.loss:
                    port.dropped += 1
                    continue
                port.queue.append((port.release_time(clock()), packet))


class DelayLineStats(TypedDict):
    """A delay line's stats file: its process, CPU time and each port's counters."""

    pid: int
    cpu_s: float
    ports: dict[str, dict[str, float]]


def write_stats(path: Path, ports: list[Port]) -> None:
    times = os.times()
    data: DelayLineStats = {
        "pid": os.getpid(),
        "cpu_s": times.user + times.system,
        "ports": {port.name: port.stats() for port in ports},
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def realtime(priority: int) -> bool:
    """SCHED_FIFO so that releases are not late on a loaded machine; False if refused."""
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (PermissionError, OSError):
        return False
    return True


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--port",
        action="append",
        required=True,
        metavar="JSON",
        help='one TUN: {"name": "d-west", "delay_s": 0.02, "jitter_s": 0, "loss": 0, "seed": 1}',
    )
    parser.add_argument(
        "--parent-pid",
        type=int,
        default=0,
        help="exit when this process is no longer our parent (0: never)",
    )
    parser.add_argument("--stats", type=Path, help="JSON counters, written on SIGUSR1 and exit")
    parser.add_argument("--control", type=Path,
                        help="JSON delay_s, jitter_s, loss: read again on SIGHUP")
    parser.add_argument(
        "--priority",
        type=int,
        default=10,
        help="SCHED_FIFO priority (0 keeps the normal scheduler)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    ports = []
    for spec in args.port:
        port = Port(**json.loads(spec))
        port.rng = random.Random(port.seed)
        port.fd = open_tun(port.name, port.offloads)
        ports.append(port)
    rt = realtime(args.priority) if args.priority else False
    print(json.dumps({"ready": True, "pid": os.getpid(), "realtime": rt}), flush=True)
    with contextlib.suppress(OSError):
        sys.stdout.close()
    run(ports, args.parent_pid, args.stats, args.control)


if __name__ == "__main__":
    main()
