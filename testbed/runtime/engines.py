"""What a worker computes: real torch forward/backward/step, or the same schedule with the
GPU held busy for the time the compute model gives and tensors of the real size.

Engines are synchronous and run in the worker's compute thread, so the event loop keeps
moving data while a stage computes, as a GPU's copy engines would.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from testbed.runtime.allreduce import Bytes, Contribution

if TYPE_CHECKING:
    from testbed.plan.collective import Collective
    from testbed.runtime.messages import Config, PrefillPart


class Engine(Protocol):
    def forward(self, iteration: int, microbatch: int, received: bytearray | None) -> bytes | None:
        """Run the forward; return the activations to send on (None on the last stage)."""

    def backward(self, iteration: int, microbatch: int, received: bytearray | None) -> bytes | None:
        """Run the backward; return the input gradient to send back (None on stage 0)."""

    def contribute(self, collective: Collective, nbytes: int, members: int) -> Contribution:
        """This stage's part of `collective` as it joins (its gradients, or its deltas
        from the outer parameters), for a group of `members`; `nbytes`: its size on the
        wire as planned."""

    def reduced(self, collective: Collective, contribution: Contribution,
                members: int) -> None:
        """Take the sum `contribution` now holds: averaged gradients for the step, or
        averaged deltas for the fragment's outer step."""

    def step(self) -> None:
        """Optimizer step, then clear gradients for the next iteration."""

    def outer_step(self, collective: Collective) -> None:
        """The outer optimizer step of `collective`'s fragment on its averaged deltas;
        the fragment's parameters take the outer ones."""

    def take_loss(self) -> float | None:
        """Mean training loss of the iteration just computed (last stage only)."""

    def save(self, path: str) -> None:
        """Write this stage's parameters (real compute only)."""

    def checkpoint(self, path: str) -> None:
        """Write what resuming needs: parameters and optimizer state (real compute only)."""

    def restore(self, path: str) -> None:
        """Read back what `checkpoint` wrote."""

    def quick(self) -> bool:
        """True when a call is so short that handing it to the compute thread costs more
        than running it on the event loop."""

    def prefill(self, parts: Sequence[PrefillPart], modeled_s: float) -> dict[int, bytes]:
        """Run a prefill pass in a bubble; the KV cache (and first token) to ship of each
        request the pass completes."""


QUICK_S = 2e-4
"""Below this, a modeled compute runs on the event loop (a thread handoff costs more)."""


@dataclass
class EmulatedEngine:
    """Holds the GPU busy for modeled times; sends zero-filled tensors of the real size."""

    forward_s: float
    backward_s: float
    step_s: float
    activation_bytes: int
    first: bool
    last: bool

    def __post_init__(self) -> None:
        self._activation = bytes(self.activation_bytes)
        self._buffers: dict[int, bytearray] = {}  # GBs for large stages: only when sent

    def forward(self, iteration: int, microbatch: int, received: bytearray | None) -> bytes | None:
        time.sleep(self.forward_s)
        return None if self.last else self._activation

    def backward(self, iteration: int, microbatch: int, received: bytearray | None) -> bytes | None:
        time.sleep(self.backward_s)
        return None if self.first else self._activation

    def contribute(self, collective: Collective, nbytes: int, members: int) -> Contribution:
        """Zeros of the planned size (one buffer per size: its content never matters)."""
        if nbytes not in self._buffers:
            self._buffers[nbytes] = bytearray(nbytes)
        return Bytes(self._buffers[nbytes], members)

    def reduced(self, collective: Collective, contribution: Contribution,
                members: int) -> None:
        """Nothing to take: the bytes are placeholders."""

    def step(self) -> None:
        time.sleep(self.step_s)

    def outer_step(self, collective: Collective) -> None:
        time.sleep(self.step_s)

    def take_loss(self) -> float | None:
        return None

    def save(self, path: str) -> None:
        """Emulated stages have no parameters to save."""

    def checkpoint(self, path: str) -> None:
        """Nor state to resume: the iteration count is all."""

    def restore(self, path: str) -> None:
        """Nothing was saved."""

    def quick(self) -> bool:
        return max(self.forward_s, self.backward_s, self.step_s) < QUICK_S

    def prefill(self, parts: Sequence[PrefillPart], modeled_s: float) -> dict[int, bytes]:
        time.sleep(modeled_s)
        return {part.request: bytes(part.kv_bytes) for part in parts if part.last}


def make_real_engine(config: Config) -> Engine:
    """Imported lazily: emulated workers never load torch."""
    from testbed.runtime.real_engine import RealEngine

    return RealEngine.from_config(config)
