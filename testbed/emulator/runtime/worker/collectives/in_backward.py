"""A collective started inside a backward, as an engine is given it: its own module so
that both engines (emulated, real torch) can take it without importing each other."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from testbed.emulator.runtime.worker.collectives.allreduce import Contribution

if TYPE_CHECKING:
    from testbed.plan.collective import Collective

Started = Callable[[Contribution], None]
"""What a bucket's contribution goes to once made (on the compute thread)."""


@dataclass(frozen=True)
class InBackward:
    """A START in a backward, as its engine is given it."""

    collective: Collective
    ready: float
    """How far into the backward its values are there (testbed.plan.buckets): when
    emulated compute starts it."""
    nbytes: int
    """Its size on the wire as planned (what emulated compute sends)."""
    members: int
    started: Started
