"""Reading a file: bounded in size, and only what can be read to an end.

A topology is a few kilobytes; a gigabyte file, or /dev/zero, is a mistake or an attack,
and is refused by a one-line error before it is read whole. What is read is bounded in
depth too (MAX_NESTING), by the YAML and JSON readers built on this one.
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
MAX_NESTING = 64
"""Lists and mappings inside one another, in any file testbed reads. Its own files nest
under 10 deep (compare.json, which holds each run's results, 7); code that walks a value
(checks, copies, writing it again) recurses once or more per level, so a few hundred
bytes of `[[[[...` would end in a RecursionError deep inside testbed instead of one
line about the file."""


def read_input(path: str | Path, limit: int) -> str:
    """The text of `path` (UTF-8), or an InputError naming it: missing, a directory, a
    device or socket (a pipe is read like a file), or more than `limit` bytes."""
    data = read_bounded(path, limit, pipes=True)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", str(path)) from None


def read_bounded(path: str | Path, limit: int, *, pipes: bool = False,
                 follow: bool = True) -> bytes:
    """The bytes of `path`, or an InputError naming it: missing, a directory, a device or
    socket, a pipe (unless `pipes`: `<(...)` on a command line), a symbolic link (unless
    `follow`), or more than `limit` bytes. A device is never opened (opening one may
    block, or act), and what is opened is checked again before it is read."""
    source = str(path)
    try:
        status = os.stat(path) if follow else os.lstat(path)
        _readable(status, source, pipes)
        # a pipe waits for its writer, as a shell's does; nothing else may block
        waits = 0 if stat.S_ISFIFO(status.st_mode) else os.O_NONBLOCK
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | waits
                     | (0 if follow else os.O_NOFOLLOW))
    except FileNotFoundError:
        raise InputError("no such file", source) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", source) from None
    with open(fd, "rb", closefd=True) as handle:
        status = os.fstat(fd)  # what was opened, not what was looked at
        _readable(status, source, pipes)
        if status.st_size > limit:
            raise _too_large(limit, source)
        os.set_blocking(fd, True)
        try:
            parts = [handle.read(status.st_size + 1)]  # a file whole, in one read
            got = len(parts[0])
            while parts[-1] and got <= limit:  # a pipe, or a file still growing
                parts.append(handle.read(min(MIB, limit + 1 - got)))
                got += len(parts[-1])
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror}", source) from None
    if got > limit:
        raise _too_large(limit, source)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _readable(status: os.stat_result, source: str, pipes: bool) -> None:
    kind = status.st_mode
    if stat.S_ISDIR(kind):
        raise InputError("is a directory, expected a file", source)
    if stat.S_ISLNK(kind):
        raise InputError("is a symbolic link: expected a file", source)
    if stat.S_ISFIFO(kind) and not pipes:
        raise InputError("is a pipe: expected a file", source)
    if not (stat.S_ISREG(kind) or stat.S_ISFIFO(kind)):
        raise InputError("is not a regular file (a device or socket?)", source)


def _too_large(limit: int, source: str) -> InputError:
    size = f"{limit / (1 << 30):g} GiB" if limit >= 1 << 30 else f"{limit // MIB} MiB"
    return InputError(f"larger than {size}: not an input file of testbed", source)
