"""The secret file a cluster file names (`secret`): read and checked the same way on
every machine, before anything connects. What the emulator's wire proves with it lives
with the wire (testbed.emulator.runtime.wire.secret)."""

from __future__ import annotations

import stat
from pathlib import Path

from testbed.errors import InputError
from testbed.topology.cluster import Cluster


def read_secret(cluster: Cluster) -> bytes:
    """The secret's bytes; InputError naming the cluster file's `secret` key otherwise."""
    path = cluster.secret
    if path is None:
        raise InputError("a run across machines needs `secret`: a file every machine holds "
                         "(e.g. 32 random bytes, mode 600)", cluster.source, "secret")
    try:
        return read_secret_file(path)
    except InputError as exc:
        raise exc.at(cluster.source, "secret") from None


def read_secret_file(path: Path) -> bytes:
    """The secret in `path`: readable by its owner alone and at least 16 bytes long (the
    same rule on every machine); InputError saying what is wrong otherwise."""
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise InputError(f"{path} is open to other users (mode {stat.S_IMODE(mode):o}); "
                         f"chmod 600 it")
    if len(data.strip()) < 16:
        raise InputError(f"{path} holds {len(data.strip())} bytes; a secret needs at least "
                         "16")
    return data.strip()
