"""Writing files so that a reader never sees half of one, and never through a link.

Every output of ours goes through here. A results directory may hold a symbolic link
where an output belongs (planted, or copied along); as root, opening that name would
write into whatever it points at. So outputs are written to a fresh file created beside
the target (exclusively: never an existing name, so never a link) and renamed over it,
which replaces a link instead of following it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, TextIO


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
