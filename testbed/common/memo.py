"""Answers kept across commands on this machine: a search a policy ran before, with the
same inputs on the same code, is read back instead of run again (Atlas's plan search
takes seconds to tens of seconds; the run that follows it often less).

A key must say everything its answer depends on; the store adds the version of the code
that computes it (every source file of testbed and of the policy's package, by size and
modification time, and torch's and Python's versions), so an edited file or an upgrade
starts afresh. The answer read back is the one that code computed for that key: the same
answer a fresh search gives, since the search is deterministic.

Where: `$TESTBED_CACHE_DIR`, else `$XDG_CACHE_HOME/testbed`, else `~/.cache/testbed`;
`TESTBED_CACHE=off` keeps nothing. The store keeps the newest KEPT answers written (an
Atlas answer is a few kilobytes): every edit of the code starts new keys, and a sweep
writes one per point whose search differs, so it would otherwise only grow. A store that
cannot be opened or written keeps nothing and says why once: the answers are then
computed, as without it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import pickle
import sqlite3
import sys
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from testbed.errors import TestbedWarning

ENV_DIR = "TESTBED_CACHE_DIR"
ENV_SWITCH = "TESTBED_CACHE"
FILE = "answers.sqlite"
KEPT = 10_000
"""Answers a store keeps, the newest written (tens of megabytes at most)."""


class Memo(Protocol):
    """Answers by key: None for one not kept."""

    def get(self, key: Any) -> Any | None: ...

    def put(self, key: Any, value: Any) -> None: ...


class NoMemo:
    """Keeps nothing."""

    def get(self, key: Any) -> Any | None:
        return None

    def put(self, key: Any, value: Any) -> None:
        pass


@dataclass
class DiskMemo:
    """Answers in one SQLite file (several processes may share it: a sweep's workers),
    by a digest of the code's version and the key's repr; values pickled."""

    path: Path
    version: str
    keep: int = KEPT
    """The newest answers written that it keeps."""
    _connection: sqlite3.Connection | None = field(default=None, repr=False)
    _pid: int = 0
    _broken: bool = False

    def get(self, key: Any) -> Any | None:
        row = self._run("SELECT value FROM answers WHERE key = ?", (self._digest(key),))
        if not row:
            return None
        try:
            return pickle.loads(row[0])
        except Exception:  # written by another version of a class: a miss
            return None

    def put(self, key: Any, value: Any) -> None:
        self._run("INSERT OR REPLACE INTO answers (key, value) VALUES (?, ?)",
                  (self._digest(key), pickle.dumps(value, pickle.HIGHEST_PROTOCOL)))
        # a row written gets the next rowid (a replaced one too): the oldest go first
        self._run("DELETE FROM answers WHERE rowid <= (SELECT MAX(rowid) FROM answers) - ?",
                  (self.keep,))

    def _digest(self, key: Any) -> str:
        return hashlib.sha256(f"{self.version}\0{key!r}".encode()).hexdigest()

    def _run(self, sql: str, args: tuple[Any, ...]) -> Any:
        if self._broken:
            return None
        try:
            connection = self._connect()
            with connection:
                return connection.execute(sql, args).fetchone()
        except (OSError, sqlite3.Error) as error:
            self._broken = True
            warnings.warn(f"{self.path}: not keeping planning answers ({error}); set "
                          f"{ENV_SWITCH}=off to silence this", TestbedWarning, stacklevel=3)
            return None

    def _connect(self) -> sqlite3.Connection:
        """One connection per process (a forked child opens its own)."""
        if self._connection is None or self._pid != os.getpid():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._connection = sqlite3.connect(self.path, timeout=30)
            self._connection.execute(
                "CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, value BLOB)")
            self._pid = os.getpid()
        return self._connection


def cache_dir() -> Path:
    """Where kept answers live (see the module's docstring)."""
    named = os.environ.get(ENV_DIR)
    if named:
        return Path(named).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "testbed"


def user_memo(modules: Iterable[str]) -> Memo:
    """The store for answers computed by code in `modules` (and testbed), or one keeping
    nothing where `TESTBED_CACHE=off`."""
    if os.environ.get(ENV_SWITCH, "").strip().lower() in ("off", "0", "no", "false"):
        return NoMemo()
    return DiskMemo(cache_dir() / FILE, _running_version(frozenset({"testbed", *modules})))


@functools.cache
def _running_version(modules: frozenset[str]) -> str:
    """`code_version` once per process: the code running is what it imported (a command
    planning many times walks the sources once)."""
    return code_version(modules)


def code_version(modules: Iterable[str]) -> str:
    """A digest of every Python source file of these modules' top-level packages (path,
    size, modification time), torch's version where installed, and Python's."""
    digest = hashlib.sha256(sys.version.encode())
    try:
        digest.update(importlib.metadata.version("torch").encode())
    except importlib.metadata.PackageNotFoundError:
        digest.update(b"no torch")
    for path in sorted({p for m in modules for p in _sources(m)}):
        stat = path.stat()
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _sources(module: str) -> list[Path]:
    """The source files of `module`'s top-level package (or the module, if it is one)."""
    top = sys.modules.get(module.partition(".")[0])
    where = getattr(top, "__file__", None)
    if not where:
        return []
    if Path(where).name != "__init__.py":
        return [Path(where)]
    out = []
    for directory, folders, files in os.walk(Path(where).parent):
        folders[:] = [f for f in folders if f != "__pycache__"]
        out += [Path(directory, f) for f in files if f.endswith(".py")]
    return out
