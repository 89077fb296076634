"""How long work says how far it has got, whoever shows it: a command's reporter
(testbed.cli.progress, a bar on a terminal and a line every few seconds in a log), or
nobody. Work below the command line takes a `Counting` and calls its steps."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol


class Steps(Protocol):
    """Units of one piece of work: `start` as one begins (where they run one at a time),
    `finish` as one ends; each named as the user knows it (`atlas-r2`, a point)."""

    def start(self, name: str) -> None: ...

    def finish(self, name: str) -> None: ...


Counting = Callable[[str, int, str], AbstractContextManager[Steps]]
"""`counting(title, total, unit)`: the steps of `total` units of work (`unit` singular),
shown under `title` while the block is open."""


class _Unseen:
    def start(self, name: str) -> None:
        pass

    def finish(self, name: str) -> None:
        pass


@contextmanager
def unseen(_title: str, _total: int, _unit: str) -> Iterator[Steps]:
    """A `Counting` that shows nothing: work run where nobody watches (tests, the API)."""
    yield _Unseen()
