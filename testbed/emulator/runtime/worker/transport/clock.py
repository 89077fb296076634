"""The run's clock. Every time a worker reports (spans, iteration ends, a chunk's send
start) is on the coordinator's monotonic clock: on the coordinator's machine that is the
machine's own; a worker on another machine learns the difference when it joins
(testbed.emulator.runtime.worker.join) and subtracts it here."""

from __future__ import annotations

import time

_offset_s = 0.0


def now() -> float:
    """Seconds on the coordinator's monotonic clock."""
    return time.monotonic() - _offset_s


def set_offset(seconds: float) -> None:
    """This machine's monotonic clock runs `seconds` ahead of the coordinator's."""
    global _offset_s
    _offset_s = seconds
