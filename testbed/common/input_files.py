"""Reading a file a user names: bounded in size, and only what can be read to an end.

A topology is a few kilobytes; a gigabyte file, or /dev/zero, is a mistake or an attack,
and is refused by a one-line error before it is read whole.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from testbed.errors import InputError

MIB = 1 << 20
MAX_YAML_BYTES = 4 * MIB
"""Topology, job and cluster files: the largest shipped topology is under 2 KiB, and an
inline trace of 100,000 requests is about 2 MiB."""
MAX_CSV_BYTES = 64 * MIB
"""Plan and trace CSV files: a plan for 16,384 GPUs is about 38 MB."""


def read_input(path: str | Path, limit: int) -> str:
    """The text of `path` (UTF-8), or an InputError naming it: missing, a directory, a
    device or socket (a pipe is read like a file), or more than `limit` bytes."""
    source = str(path)
    try:
        kind = os.stat(path).st_mode  # before opening: opening a device may block
        if stat.S_ISDIR(kind):
            raise InputError("is a directory, expected a file", source)
        if not (stat.S_ISREG(kind) or stat.S_ISFIFO(kind)):
            raise InputError("is not a regular file (a device or socket?)", source)
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        raise InputError("no such file", source) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", source) from None
    if len(data) > limit:
        raise InputError(f"larger than {limit // MIB} MiB: not an input file of testbed",
                         source)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", source) from None
