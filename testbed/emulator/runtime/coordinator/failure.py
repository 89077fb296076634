"""How a run ends early: the first reason it cannot go on (and waiting for anything unless
that comes first), an interruption, and work that must finish even when cancelled."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable
from typing import Any, TypeVar

from testbed.errors import TestbedError

T = TypeVar("T")


class RunFailed(TestbedError):
    """The run could not finish; what was measured is still written."""


class Failure:
    """Set once, by whoever notices first (a dead worker, a stall, a broken link)."""

    def __init__(self) -> None:
        self._future: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def fail(self, message: str) -> None:
        if not self._future.done():
            self._future.set_result(message)

    @property
    def reason(self) -> str | None:
        return self._future.result() if self._future.done() else None

    async def race(self, awaitable: Awaitable[T]) -> T:
        """Await something, unless the run fails first (then RunFailed with the reason)."""
        task = asyncio.ensure_future(awaitable)
        either: set[asyncio.Future[Any]] = {task, self._future}
        done, _ = await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise RunFailed(self._future.result())


class Interrupted(TestbedError):
    """Ctrl-C or SIGTERM during a run."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__("interrupted" if signum == signal.SIGINT else "terminated")


async def to_the_end(work: Awaitable[T]) -> T:
    """Await `work` even if this task is cancelled meanwhile (Ctrl-C or SIGTERM while the
    network comes up or goes down): it must finish so that teardown knows what exists;
    the cancellation is passed on afterwards."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    result = task.result()
    if cancelled:
        raise asyncio.CancelledError
    return result
