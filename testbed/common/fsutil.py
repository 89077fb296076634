"""Writing files so that a reader never sees half of one, and never through a link.

Every output of ours goes through here. A results directory may hold a symbolic link
where an output belongs (planted, or copied along); as root, opening that name would
write into whatever it points at. So outputs are written to a fresh file created beside
the target (exclusively: never an existing name, so never a link) and renamed over it,
which replaces a link instead of following it; a directory of ours inside one is made
the same way (own_directory).

A file the user names on the command line (`plan --csv`, `profile -o`, `figures
--readme`) is different in one way: it may be a device or a pipe meant to take the
output (`/dev/null`, `/dev/stdout`, a FIFO), which is written into, never replaced by a
file (write_named). Only a regular file, or a link to one, is replaced.
"""

from __future__ import annotations

import contextlib
import os
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO

from testbed.errors import InputError, TestbedError


@contextlib.contextmanager
def atomic_output(path: Path, mode: int = 0o644) -> Iterator[BinaryIO]:
    """A private new file beside `path` to write into; flushed and renamed over `path`
    when the block ends, removed if it fails."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_atomic(path: Path, text: str, mode: int = 0o600) -> None:
    """`text` as the whole of `path`, all at once."""
    with atomic_output(path, mode) as handle:
        handle.write(text.encode("utf-8"))


def open_fresh(path: Path, mode: int = 0o644) -> TextIO:
    """`path` as a new file to write as things happen (a log): whatever held the name
    before, a link included, is removed first, never followed."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    return os.fdopen(fd, "w", encoding="utf-8")


def own_directory(root: Path, *names: str) -> Path:
    """`root/names...`, each a directory of ours inside the output directory `root`:
    made where missing; whatever else holds one of the names (a symbolic link above all,
    planted or copied along) is removed first, never followed."""
    path = root
    for name in names:
        path = path / name
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                os.unlink(path)
        with contextlib.suppress(FileExistsError):
            path.mkdir()
    return path


def write_named(path: Path, text: str, option: str) -> None:
    """`text` as the whole of `path`, a file the user named with `option`. This process's
    own stdout or stderr (`/dev/stdout`, whatever it is), a character device
    (`/dev/null`) or a pipe is written into and stays what it was; a regular file (or a
    link to one) is replaced, as any output is (write_atomic); anything else is
    refused."""
    try:
        status: os.stat_result | None = os.stat(path)
    except FileNotFoundError:
        status = None
    except OSError as exc:
        raise InputError(f"{path}: cannot write: {exc.strerror}", option) from None
    data = text.encode("utf-8")
    try:
        if status is not None and _standard_stream(status, data):
            return
        if status is None or stat.S_ISREG(status.st_mode):
            write_atomic(path, text, 0o644)
            return
        if not (stat.S_ISCHR(status.st_mode) or stat.S_ISFIFO(status.st_mode)):
            raise InputError(f"{path} is {_kind(status.st_mode)}; give a file, a pipe or a "
                             "character device such as /dev/null", option)
        # written into as it is (a device or pipe has nothing to truncate or replace)
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_CLOEXEC)
        try:
            if not os.path.samestat(os.fstat(fd), status):
                raise InputError(f"{path} changed while it was being opened", option)
            _write_all(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        raise TestbedError(f"{option}: cannot write {path}: {exc.strerror}") from None


def _standard_stream(status: os.stat_result, data: bytes) -> bool:
    """Write `data` to this process's stdout or stderr if `status` is what that writes
    to (after what was printed before it); False if it is neither."""
    for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
        try:
            if not os.path.samestat(os.fstat(fd), status):
                continue
        except OSError:
            continue
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
        _write_all(fd, data)
        return True
    return False


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISBLK(mode):
        return "a block device (a disk?)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"
