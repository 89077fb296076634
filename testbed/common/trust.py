"""Files testbed keeps for itself and reads back (the planning store, the capacity cache)
are believed only where no one else could have written them: a folder and file owned by
root or the user running testbed, writable by no one else, every folder above likewise
(or sticky, as /tmp is), and the file itself not a link. Anything else is someone else's
and is treated as absent. Files a user names as input are not of this kind: they are
checked as input, whoever owns them.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE = 0o700
"""The mode of a folder testbed makes for itself."""


class Untrusted(Exception):
    """A file or folder of testbed's own that someone else could have written; the message
    names it and says why."""


def owners() -> tuple[int, ...]:
    """Who may own what testbed trusts: root, and the user running it."""
    return (0, os.geteuid())


def owned_folder(folder: Path, make: bool = False) -> Path:
    """`folder` with its links resolved, once it and every folder above it are checked
    (with `make`, made PRIVATE where missing, the folders above as umask allows). Raises
    Untrusted."""
    if make:
        folder.mkdir(mode=PRIVATE, parents=True, exist_ok=True)
    real = Path(os.path.realpath(folder))
    for place in (real, *real.parents):
        info = os.lstat(place)
        if not stat.S_ISDIR(info.st_mode):
            raise Untrusted(f"{place} is not a folder")
        if info.st_uid not in owners():
            raise Untrusted(f"{place} belongs to user {info.st_uid}, not root or "
                            f"{os.geteuid()}")
        sticky = place != real and info.st_mode & stat.S_ISVTX
        if info.st_mode & 0o022 and not sticky:
            raise Untrusted(f"{place} may be written by others (mode "
                            f"{stat.S_IMODE(info.st_mode):04o})")
    return real


def check_owned(path: Path, info: os.stat_result, private: bool = False) -> None:
    """Raises Untrusted unless `info` (path's, links not followed) is a regular file owned
    by root or this user that no one else may write (with `private`, nor read)."""
    if stat.S_ISLNK(info.st_mode):
        raise Untrusted(f"{path} is a symbolic link")
    if not stat.S_ISREG(info.st_mode):
        raise Untrusted(f"{path} is not a regular file")
    if info.st_uid not in owners():
        raise Untrusted(f"{path} belongs to user {info.st_uid}, not root or {os.geteuid()}")
    if info.st_mode & (0o077 if private else 0o022):
        raise Untrusted(f"{path} may be {'read or ' if private else ''}written by others "
                        f"(mode {stat.S_IMODE(info.st_mode):04o})")


def read_owned(path: Path, limit: int, private: bool = False) -> bytes | None:
    """The bytes of a file of testbed's own in a checked folder (`owned_folder`), None
    where there is none; Untrusted where it is a link, not a regular file, someone else's,
    writable by others (with `private`, readable) or larger than `limit` bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as error:
        if os.path.islink(path):
            raise Untrusted(f"{path} is a symbolic link") from error
        raise
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        check_owned(path, info, private)
        if info.st_size > limit:
            raise Untrusted(f"{path} holds {info.st_size} bytes, more than its {limit}")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise Untrusted(f"{path} holds more than its {limit} bytes")
    return data
