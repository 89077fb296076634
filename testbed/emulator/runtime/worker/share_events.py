"""Network events reaching the process that holds a machine's share of a network across
machines (its first process: a worker, a decode server or a holder alone): it changes the
link directions its machine's routers send."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from testbed.emulator.runtime.wire.join_messages import LinkChange
from testbed.emulator.runtime.wire.messages import WorkerError, send

LinkChanger = Callable[[LinkChange], None]
"""Applies a network event to the share this process holds (blocking)."""


async def apply_link_change(links: LinkChanger, change: LinkChange,
                            control: asyncio.StreamWriter) -> None:
    """Apply it off the event loop; one that fails ends the run, saying why."""
    try:
        await asyncio.to_thread(links, change)
    except Exception as exc:
        await send(control, WorkerError(f"network event on {change.a}-{change.b} could not "
                                        f"be applied on this machine: {exc}", -1, []))
