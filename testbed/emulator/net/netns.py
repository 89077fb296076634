"""Namespaces, links, addresses, routes and qdiscs through pyroute2's sync API.

The only module that imports pyroute2. Callers on an event loop run these in a thread
(pyroute2's async API does not work on uvloop).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TypedDict

from pyroute2 import IPRoute, NetNS, config, netns
from pyroute2.netlink.exceptions import NetlinkError

from testbed.emulator.net.shaping import Qdisc
from testbed.emulator.net.state import probe_namespace, valid_name
from testbed.errors import NetworkError

# pyroute2 forks helper processes; they must not run our signal handlers (which tear
# the network down) when pyroute2 stops them with SIGTERM.
config.disable_mp_signal = True

NETNS_DIR = Path("/run/netns")
ETC_NETNS = Path("/etc/netns")
SCOPE_LINK = 253
ENOENT = 2
EEXIST = 17


def list_namespaces() -> list[str]:
    return sorted(netns.listnetns())


def create_namespace(name: str) -> None:
    try:
        netns.create(name)
    except OSError as exc:
        raise NetworkError(f"cannot create namespace {name}: {exc}") from None


def remove_namespace(name: str) -> bool:
    """Remove `name` if it exists; True if it did."""
    if not (NETNS_DIR / name).exists():
        return False
    try:
        netns.remove(name)
    except OSError:
        # the kernel frees the namespace when its last process is gone
        with contextlib.suppress(OSError):
            subprocess.run(
                ["ip", "netns", "delete", name], check=False, capture_output=True, timeout=10
            )
    return not (NETNS_DIR / name).exists()


class QdiscStats(TypedDict):
    """A qdisc's counters, as the kernel reports them."""

    kind: str
    bytes: int
    packets: int
    drops: int


class Namespaces:
    """Open netlink sockets into several namespaces, closed together."""

    def __init__(self) -> None:
        self._open: dict[str, Any] = {}  # pyroute2's NetNS handles by namespace (untyped)

    def __enter__(self) -> Namespaces:
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._open.values():
            with contextlib.suppress(Exception):
                handle.close()
        self._open.clear()

    def ns(self, name: str) -> Any:
        if name not in self._open:
            self._open[name] = NetNS(name, flags=0)  # never create one by accident
        return self._open[name]

    def index(self, ns_name: str, ifname: str) -> int:
        found = self.ns(ns_name).link_lookup(ifname=ifname)
        if not found:
            raise NetworkError(f"no interface {ifname} in namespace {ns_name}")
        return int(found[0])

    def veth(self, ns_a: str, if_a: str, ns_b: str, if_b: str) -> None:
        """A veth pair created inside `ns_a` with its peer end in `ns_b`: no name ever
        appears in the root namespace."""
        try:
            self.ns(ns_a).link(
                "add", ifname=if_a, kind="veth", peer={"ifname": if_b, "net_ns_fd": ns_b}
            )
        except NetlinkError as exc:
            raise NetworkError(
                f"cannot create veth {ns_a}/{if_a} <-> {ns_b}/{if_b}: {exc}"
            ) from None

    def up(
        self, ns_name: str, ifname: str, mtu: int | None = None, txqueuelen: int | None = None
    ) -> None:
        settings: dict[str, Any] = {"state": "up"}  # pyroute2's link keyword arguments
        if mtu is not None:
            settings["mtu"] = mtu
        if txqueuelen is not None:
            settings["txqlen"] = txqueuelen
        self.ns(ns_name).link("set", index=self.index(ns_name, ifname), **settings)

    def address(self, ns_name: str, ifname: str, address: str, prefixlen: int) -> None:
        self.ns(ns_name).addr(
            "add", index=self.index(ns_name, ifname), address=address, prefixlen=prefixlen
        )

    def route(
        self,
        ns_name: str,
        dst: str,
        ifname: str,
        gateway: str | None = None,
        table: int | None = None,
        link_scope: bool = False,
    ) -> None:
        spec: dict[str, Any] = {"dst": dst, "oif": self.index(ns_name, ifname)}  # pyroute2's
        if gateway is not None:
            spec["gateway"] = gateway
        if table is not None:
            spec["table"] = table
        if link_scope:
            spec["scope"] = SCOPE_LINK
        try:
            self.ns(ns_name).route("add", **spec)
        except NetlinkError as exc:
            raise NetworkError(f"cannot add route {dst} in {ns_name}: {exc}") from None

    def rule_from_interface(self, ns_name: str, ifname: str, table: int, priority: int) -> None:
        self.ns(ns_name).rule("add", iifname=ifname, table=table, priority=priority)

    def qdisc(self, q: Qdisc, command: str = "add") -> None:
        """Add (or, with command="change", change) a qdisc or htb class."""
        handle = self.ns(q.netns)
        index = self.index(q.netns, q.ifname)
        params = dict(q.params)
        try:
            if q.kind == "htb-class":
                handle.tc(f"{command}-class", "htb", index, q.handle, parent=q.parent,
                          **params)
            elif q.parent is None:
                handle.tc(command, q.kind, index, q.handle, **params)
            else:
                handle.tc(command, q.kind, index, q.handle, parent=q.parent, **params)
        except NetlinkError as exc:
            if q.kind == "netem" and exc.code == ENOENT:
                raise NetworkError(
                    "this kernel has no netem qdisc (sch_netem); use --shaper userspace"
                ) from None
            raise NetworkError(f"cannot add {q.kind} on {q.netns}/{q.ifname}: {exc}") from None

    def qdisc_stats(self, ns_name: str, ifname: str) -> list[QdiscStats]:
        """Kind, bytes, packets and drops of each qdisc on an interface."""
        out: list[QdiscStats] = []
        for msg in self.ns(ns_name).get_qdiscs(index=self.index(ns_name, ifname)):
            stats = msg.get_attr("TCA_STATS2")
            basic = stats.get_attr("TCA_STATS_BASIC") if stats is not None else None
            queue = stats.get_attr("TCA_STATS_QUEUE") if stats is not None else None
            out.append(
                {
                    "kind": msg.get_attr("TCA_KIND"),
                    "bytes": basic["bytes"] if basic else 0,
                    "packets": basic["packets"] if basic else 0,
                    "drops": queue["drops"] if queue else 0,
                }
            )
        return out

    def wait_for_link(self, ns_name: str, ifname: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.ns(ns_name).link_lookup(ifname=ifname):
            if time.monotonic() > deadline:
                raise NetworkError(f"{ifname} did not appear in {ns_name} within {timeout_s:g} s")
            time.sleep(0.005)


def set_sysctls(ns_name: str, values: Mapping[str, str]) -> None:
    """sysctl inside a namespace through `ip netns exec` (no shell involved)."""
    args = ["ip", "netns", "exec", ns_name, "sysctl", "-q", "-w"]
    args += [f"{key}={value}" for key, value in values.items()]
    result = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
    if result.returncode != 0:
        raise NetworkError(f"sysctl in {ns_name} failed: {result.stderr.strip()}")


def read_sysctl(key: str, ns_name: str | None = None) -> str:
    if ns_name is None:
        return Path("/proc/sys", *key.split(".")).read_text().strip()
    result = subprocess.run(
        ["ip", "netns", "exec", ns_name, "sysctl", "-n", key],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return " ".join(result.stdout.split())


def write_root_sysctl(key: str, value: str) -> None:
    Path("/proc/sys", *key.split(".")).write_text(value)


NO_NAME_SERVER = ("# testbed: the emulated WAN has no name server; its names are in hosts\n"
                  "nameserver 127.0.0.1\n")
"""The namespaces' resolv.conf. A lookup the hosts file cannot answer (torch's c10d asks
the name of each socket it connects) is refused at once by the local port, as a cluster's
name server answers at once; the machine's own server, which no namespace reaches, held
it for the resolver's 5 s timeout whenever the router's ICMP errors (rate-limited) did not
say so first."""


def write_etc_files(ns_name: str, hosts: str) -> Path:
    """`ip netns exec` bind-mounts each file of /etc/netns/<ns> over the one of /etc: the
    emulated WAN's hosts, and its lack of a name server."""
    directory = ETC_NETNS / ns_name
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in (("hosts", hosts), ("resolv.conf", NO_NAME_SERVER)):
        path = directory / name
        tmp = directory / f"{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, path)
    return directory


def remove_etc_dir(directory: str) -> None:
    path = Path(directory)
    if path.parent != ETC_NETNS or not valid_name(path.name) or path.is_symlink():
        return  # only ever touch what we made under /etc/netns (`/etc/netns/..` is /etc)
    for child in path.iterdir() if path.is_dir() else ():
        with contextlib.suppress(FileNotFoundError):
            child.unlink()
    with contextlib.suppress(FileNotFoundError, OSError):
        path.rmdir()


@contextlib.contextmanager
def opened() -> Iterator[Namespaces]:
    with Namespaces() as handles:
        yield handles


def netem_available() -> bool:
    """Try a netem qdisc in a scratch namespace; ENOENT means the kernel lacks it."""
    name = probe_namespace()
    create_namespace(name)
    try:
        with Namespaces() as handles:
            handles.veth(name, "p0", name, "p1")
            index = handles.index(name, "p0")
            try:
                handles.ns(name).tc("add", "netem", index, 0x10000, delay=1000)
            except NetlinkError as exc:
                if exc.code == ENOENT:
                    return False
                raise
            return True
    finally:
        remove_namespace(name)


def run_ip(command: list[str], what: str) -> None:
    """Run an `ip` command the netlink calls above do not cover; fail naming `what`."""
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise NetworkError(f"{what}: {detail}")


def local_addresses() -> set[str]:
    """This machine's IPv4 addresses (its own network, not a namespace's)."""
    with IPRoute() as ip:
        return {str(a.get_attr("IFA_ADDRESS")) for a in ip.get_addr(family=socket.AF_INET)}
