"""Answers kept across commands on this machine: a search a policy ran before, with the
same inputs on the same code, is read back instead of run again (Atlas's plan search
takes seconds to tens of seconds; the run that follows it often less).

A key must say everything its answer depends on; the store adds the version of the code
that computes it (every source file of testbed and of the policy's package, by size and
modification time, and torch's and Python's versions), so an edited file or an upgrade
starts afresh. The answer read back is the one that code computed for that key: the same
answer a fresh search gives, since the search is deterministic.

The store keeps data, never code: an answer is a dataclass written as JSON through the
codec (testbed.common.codec), tagged with its class and the store's schema, and signed
with a key only this store holds (KEY_FILE, 0600, beside it). It is believed only from a
folder and file no one but root or this user could have written
(testbed.common.trust), the file not a link. A row of another schema or class, one
whose signature fails, one that does not decode as the class asked for, or one the
reader's `check` rejects is a miss, never an error: the answer is computed again, and
written over it. A store that cannot be opened, written or trusted keeps nothing and
says why once: the answers are then computed, as without it.

Where: `$TESTBED_PLANNING_STORE_DIR` (or its older name `$TESTBED_CACHE_DIR`), else
`$XDG_CACHE_HOME/testbed`, else `~/.cache/testbed`; `TESTBED_PLANNING_STORE=off` keeps
nothing (so does the older `TESTBED_CACHE=off`, read for `off` alone). The store keeps the
newest KEPT answers written (an Atlas answer is a few kilobytes): every edit of the code
starts new keys, and a sweep writes one per point whose search differs, so it would
otherwise only grow.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import importlib.metadata
import json
import os
import secrets
import sqlite3
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from testbed.common.codec import from_json, to_json
from testbed.common.trust import Untrusted, check_owned, owned_folder, read_owned
from testbed.errors import TestbedWarning

ENV_SWITCH = "TESTBED_PLANNING_STORE"
ENV_DIR = "TESTBED_PLANNING_STORE_DIR"
OLD_SWITCH = "TESTBED_CACHE"
"""The switch's older name, read for `off` alone (it also named the capacity cache's
folder once: testbed.emulator.runtime.coordinator.capacity has a variable of its own now)."""
OLD_DIR = "TESTBED_CACHE_DIR"
"""The folder's older name, read where the new one is not set."""
OFF = ("off", "0", "no", "false")
FILE = "answers.sqlite"
KEY_FILE = "answers.key"
KEY_BYTES = 32
SCHEMA = 2
"""The store's encoding: 1 was pickles (never read again: its table is dropped)."""
KEPT = 10_000
"""Answers a store keeps, the newest written (tens of megabytes at most)."""
LARGEST = 16 * 2**20
"""Characters of the largest answer read back (Atlas's are a few thousand)."""

T = TypeVar("T")
_WARNED: set[str] = set()


class Memo(Protocol):
    """Answers by key: None for one not kept."""

    def get(self, key: Any, kind: type[T], check: Callable[[T], bool] | None = None
            ) -> T | None: ...

    def put(self, key: Any, value: Any) -> None: ...


class NoMemo:
    """Keeps nothing."""

    def get(self, key: Any, kind: type[T], check: Callable[[T], bool] | None = None
            ) -> T | None:
        return None

    def put(self, key: Any, value: Any) -> None:
        pass


@dataclass
class DiskMemo:
    """Answers in one SQLite file (several processes may share it: a sweep's workers),
    by a digest of the code's version and the key's repr; values dataclasses, as JSON."""

    path: Path
    version: str
    keep: int = KEPT
    """The newest answers written that it keeps."""
    _connection: sqlite3.Connection | None = field(default=None, repr=False)
    _secret: bytes = field(default=b"", repr=False)
    _pid: int = 0
    _broken: bool = False

    def get(self, key: Any, kind: type[T], check: Callable[[T], bool] | None = None
            ) -> T | None:
        """The answer kept for `key`, read as dataclass `kind`, where `check` (if given)
        accepts it; None otherwise (see the module's docstring)."""
        digest = self._digest(key)
        row = self._run("SELECT schema, kind, value, tag FROM kept WHERE key = ? "
                        "AND length(value) <= ?", (digest, LARGEST))
        if not row:
            return None
        schema, tagged, text, tag = row
        if schema != SCHEMA or tagged != _kind(kind) or not isinstance(text, str) \
                or not isinstance(tag, str) \
                or not hmac.compare_digest(tag, self._sign(digest, tagged, text)):
            return None
        try:
            value: T = from_json(json.loads(text), kind, kind.__name__)
            if check is not None and not check(value):
                return None
        except Exception:  # a shape this code does not read, or a check that cannot run
            return None
        return value

    def put(self, key: Any, value: Any) -> None:
        """Keeps `value`, a dataclass whose fields the codec reads back."""
        if not is_dataclass(value) or isinstance(value, type):
            raise TypeError(f"a kept answer is a dataclass, not {type(value).__name__}")
        text = json.dumps(to_json(value))
        digest, kind = self._digest(key), _kind(type(value))
        if self._connect_or_warn() is None:
            return
        self._run("INSERT OR REPLACE INTO kept (key, schema, kind, value, tag) "
                  "VALUES (?, ?, ?, ?, ?)",
                  (digest, SCHEMA, kind, text, self._sign(digest, kind, text)))
        # a row written gets the next rowid (a replaced one too): the oldest go first
        self._run("DELETE FROM kept WHERE rowid <= (SELECT MAX(rowid) FROM kept) - ?",
                  (self.keep,))

    def _digest(self, key: Any) -> str:
        return hashlib.sha256(f"{self.version}\0{key!r}".encode()).hexdigest()

    def _sign(self, digest: str, kind: str, text: str) -> str:
        message = f"{SCHEMA}\0{digest}\0{kind}\0{text}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def _run(self, sql: str, args: tuple[Any, ...]) -> Any:
        connection = self._connect_or_warn()
        if connection is None:
            return None
        try:
            with connection:
                return connection.execute(sql, args).fetchone()
        except sqlite3.Error as error:
            self._warn(str(error))
            return None

    def _connect_or_warn(self) -> sqlite3.Connection | None:
        if self._broken:
            return None
        try:
            return self._connect()
        except Untrusted as error:
            self._warn(f"not trusted: {error}")
        except (OSError, sqlite3.Error) as error:
            self._warn(str(error))
        return None

    def _warn(self, why: str) -> None:
        """Once per process for each store and reason (a command plans many times)."""
        self._broken = True
        message = f"{self.path}: not keeping planning answers ({why}); set " \
                  f"{ENV_SWITCH}=off to silence this"
        if message not in _WARNED:
            _WARNED.add(message)
            warnings.warn(message, TestbedWarning, stacklevel=4)

    def _connect(self) -> sqlite3.Connection:
        """One connection per process (a forked child opens its own), once the folder,
        the file and its key are checked."""
        if self._connection is None or self._pid != os.getpid():
            folder = owned_folder(self.path.parent, make=True)
            path = folder / self.path.name
            with contextlib.suppress(FileExistsError):  # private: SQLite follows umask
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                                 | os.O_CLOEXEC, 0o600))
            check_owned(path, os.lstat(path))
            self._secret = _store_key(folder / KEY_FILE)
            connection = sqlite3.connect(path, timeout=30)
            with connection:
                connection.execute("CREATE TABLE IF NOT EXISTS kept (key TEXT PRIMARY KEY, "
                                   "schema INTEGER, kind TEXT, value TEXT, tag TEXT)")
                connection.execute("DROP TABLE IF EXISTS answers")  # schema 1's pickles
            self._connection, self._pid = connection, os.getpid()
        return self._connection


def _kind(cls: type[Any]) -> str:
    """What a row says its answer is: the class by its module and name."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _store_key(path: Path) -> bytes:
    """The store's signing key: KEY_BYTES random bytes in a 0600 file, made by the first
    process that needs it (several may race: one file wins, whole, and all read it)."""
    key = read_owned(path, KEY_BYTES, private=True)
    if key is None:
        fd, made = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(secrets.token_bytes(KEY_BYTES))
                file.flush()
                os.fsync(file.fileno())
            with contextlib.suppress(FileExistsError):
                os.link(made, path)
        finally:
            os.unlink(made)
        key = read_owned(path, KEY_BYTES, private=True)
    if key is None or len(key) != KEY_BYTES:
        raise Untrusted(f"{path} is not a key of {KEY_BYTES} bytes")
    return key


def store_dir() -> Path:
    """Where kept answers live (see the module's docstring)."""
    named = os.environ.get(ENV_DIR) or os.environ.get(OLD_DIR)
    if named:
        return Path(named).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "testbed"


def switched_off() -> bool:
    """Whether the user keeps no answers: `TESTBED_PLANNING_STORE=off` (or the older
    `TESTBED_CACHE=off`, where the new one is not set)."""
    value = os.environ.get(ENV_SWITCH)
    if value is None:
        value = os.environ.get(OLD_SWITCH, "")
    return value.strip().lower() in OFF


def user_memo(modules: Iterable[str]) -> Memo:
    """The store for answers computed by code in `modules` (and testbed), or one keeping
    nothing where the user switched it off."""
    if switched_off():
        return NoMemo()
    return DiskMemo(store_dir() / FILE, _running_version(frozenset({"testbed", *modules})))


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
