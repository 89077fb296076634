"""Running a coordinator under SIGINT and SIGTERM: either signal becomes an orderly
teardown and Interrupted, never a half-removed network."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from typing import TYPE_CHECKING

from testbed.emulator.runtime.coordinator.failure import Interrupted, RunFailed
from testbed.emulator.runtime.worker.process import run_loop
from testbed.errors import TestbedError

if TYPE_CHECKING:
    from testbed.emulator.runtime.coordinator.coordinator import Coordinator, RunOutcome


def run_to_the_end(coordinator: Coordinator) -> tuple[RunOutcome | None, TestbedError | None]:
    """Run on the workers' kind of event loop, under the signals: what the run produced
    (None if it ended before it started) and, if it stopped early, why."""
    try:
        run_loop(run_with_signals(coordinator))
    except (RunFailed, Interrupted) as exc:
        return coordinator.outcome, exc
    return coordinator.outcome, None


async def run_with_signals(coordinator: Coordinator) -> RunOutcome:
    """Run, turning SIGINT/SIGTERM into an orderly teardown and Interrupted."""
    loop = asyncio.get_running_loop()
    received: list[int] = []

    def on_signal(signum: int) -> None:
        if not received:
            received.append(signum)
            coordinator.say("stopping: tearing down")
            inner.cancel()

    inner = asyncio.ensure_future(coordinator.run())
    handled = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(signum, on_signal, signum)
            handled.append(signum)
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        with contextlib.suppress(asyncio.CancelledError, TestbedError):
            await inner
        if received:
            raise Interrupted(received[0]) from None
        raise
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
