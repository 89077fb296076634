"""The shaper's counters of every WAN direction this machine sends, read every few tenths
of a second in a thread of their own while a launched program runs (netlink through
pyroute2, as `tc -s qdisc` reads them)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from testbed.emulator.net import netns as kernel
from testbed.emulator.net.network import Network
from testbed.emulator.net.shaping import Shaper
from testbed.metrics.link_counters import ETHERNET_HEADER_BYTES, Counter

SAMPLE_S = 0.2


@dataclass(frozen=True)
class Port:
    link: str
    """`east>west`: the direction leaving through it."""
    netns: str
    ifname: str
    root: str
    """The kind of the shaper's root qdisc there, whose counters are the direction's."""


def wan_ports(network: Network) -> list[Port]:
    """Where each direction this machine's routers send is shaped."""
    layout, userspace = network.layout, network.shaper is Shaper.USERSPACE
    return [Port(f"{p.dc}>{p.peer}", layout.router(p.dc).netns,
                 p.tun if userspace else p.ifname, "tbf" if userspace else "htb")
            for p in layout.ports]


def link_header(network: Network) -> int:
    """The link-layer header the shaper counts in each packet: a TUN device (userspace
    shaper) carries bare IP packets, a veth or VXLAN device Ethernet frames."""
    return 0 if network.shaper is Shaper.USERSPACE else ETHERNET_HEADER_BYTES


@dataclass
class CounterSampler:
    """Reads every port's counters every `every_s` from `start` (monotonic) on."""

    ports: list[Port]
    start: float
    every_s: float = SAMPLE_S
    samples: dict[str, list[Counter]] = field(default_factory=dict)
    error: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def begin(self) -> None:
        self._thread = threading.Thread(target=self._run, name="wan-counters", daemon=True)
        self._thread.start()

    def end(self) -> None:
        """One last sample, then stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        try:
            with kernel.Namespaces() as k:
                while True:
                    self._sample(k)
                    if self._stop.wait(self.every_s):
                        self._sample(k)
                        return
        except Exception as exc:  # the launch goes on; results say counters stopped
            self.error = f"{type(exc).__name__}: {exc}"

    def _sample(self, k: kernel.Namespaces) -> None:
        for port in self.ports:
            stats = k.qdisc_stats(port.netns, port.ifname)
            t = time.monotonic() - self.start
            root = next((s for s in stats if s["kind"] == port.root), None)
            if root is not None:
                self.samples.setdefault(port.link, []).append(
                    Counter(t, int(root["bytes"]), int(root["packets"]), int(root["drops"])))
