"""Results directories, one process at a time.

A generated name is created exclusively (the next suffix when another process made it
first), and a process writing into a directory holds an exclusive lock on the directory
itself (flock on its descriptor: no file is added, and the kernel drops the lock when the
process dies, however it dies). So two runs never write into one directory, and
`up --resume` cannot take over a run that is still going. A directory a command created
is recorded while the command runs (testbed.common.made_dirs), so that `testbed down`
removes it where a killed command left it empty.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

from testbed.common import made_dirs
from testbed.errors import InputError

_held: dict[tuple[int, int], int] = {}
"""(device, inode) of each directory this process holds -> the descriptor holding it."""
_made: list[Path] = []
"""Directories claimed that this process created."""


def one_name(label: str) -> str:
    """A run's label (a policy, or a plan's file with its path) as one directory name."""
    return "".join(c if c.isalnum() or c in "-_.+" else "_" for c in label) or "run"


def fresh_directory(base: Path, name: str) -> Path:
    """`base/name`, or `base/name-2`, ...: the first one this process creates itself."""
    base.mkdir(parents=True, exist_ok=True)
    for number in itertools.count(1):
        path = base / (name if number == 1 else f"{name}-{number}")
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")


def claim(path: Path, what: str | None, made: bool = False) -> None:
    """Hold directory `path` until `released` ends (a command's whole life); a located
    InputError (`what`: the option that named it) when another process holds it.
    `made`: this process created it, so it goes again if it is still empty then (a
    command refused after choosing its directory leaves none behind)."""
    _lock(path, what)
    if made:
        _made.append(path)
        made_dirs.record(_made)


@contextlib.contextmanager
def released() -> Iterator[None]:
    """Around a command: what it claimed is let go at its end, however it ends."""
    try:
        yield
    finally:
        for path in reversed(_made):
            remove_if_empty(path)
        if _made:
            made_dirs.forget()
        _made.clear()
        for fd in _held.values():
            os.close(fd)
        _held.clear()


@contextlib.contextmanager
def holding(path: Path) -> Iterator[None]:
    """Hold `path` while inside (already held by this process: it stays held)."""
    key = _lock(path, None)
    try:
        yield
    finally:
        if key is not None:
            os.close(_held.pop(key))


def remove_if_empty(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.rmdir()


def _lock(path: Path, what: str | None) -> tuple[int, int] | None:
    """Lock `path`; the key of a lock newly taken, None if this process held it already."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        problem = ("is a symbolic link; give the directory itself" if exc.errno == errno.ELOOP
                   else f"cannot be opened: {exc.strerror}")
        raise InputError(f"{path} {problem}", what) from None
    status = os.fstat(fd)
    key = (status.st_dev, status.st_ino)
    if key in _held:
        os.close(fd)
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise InputError(f"{path} is in use by another testbed process (a run still "
                         "writing there); wait for it or stop it", what) from None
    _held[key] = fd
    return key
