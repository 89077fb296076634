"""Entering a named network namespace from a running process (setns(2)).

A process torchrun started on a machine's own network connects to the coordinator first,
then becomes a host of the emulated WAN by moving into the host's namespace; the
connection it opened stays in the namespace it was made in. `ip netns exec` does the same
for a new process (it also bind-mounts /etc/netns/NAME, which workers do not need: they
are given addresses, not names). setns moves only the calling thread, so a process enters
before it starts other threads, and a socket is made in another namespace by a thread of
its own (`listening_socket`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import socket
import threading

from testbed.emulator.net.netns import NETNS_DIR

CLONE_NEWNET = 0x40000000


def libc() -> ctypes.CDLL:
    """The C library, for the system calls Python 3.11 lacks (setns, prctl)."""
    return ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def enter_netns(name: str) -> None:
    """Move the calling thread into namespace `name`; FileNotFoundError if there is none."""
    fd = os.open(NETNS_DIR / name, os.O_RDONLY)
    try:
        if libc().setns(fd, CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"setns into {name}: {os.strerror(code)}")
    finally:
        os.close(fd)


def listening_socket(netns: str | None, address: str, port: int) -> socket.socket:
    """A TCP socket listening on `address:port` in namespace `netns` (None: this one)."""
    made: list[socket.socket] = []
    failed: list[BaseException] = []

    def make() -> None:
        try:
            if netns is not None:
                enter_netns(netns)
            sock = socket.create_server((address, port), reuse_port=False)
            sock.setblocking(False)
            made.append(sock)
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    if netns is None:
        make()
    else:
        thread = threading.Thread(target=make, name=f"listen-in-{netns}")
        thread.start()
        thread.join()
    if failed:
        raise failed[0]
    return made[0]
