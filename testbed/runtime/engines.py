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

if TYPE_CHECKING:
    from testbed.runtime.messages import Config, PrefillPart


class Engine(Protocol):
    def forward(self, iteration: int, microbatch: int, received: bytearray | None) -> bytes | None:
        """Run the forward; return the activations to send on (None on the last stage)."""

    def backward(self, iteration: int, microbatch: int, received: bytearray | None) -> bytes | None:
        """Run the backward; return the input gradient to send back (None on stage 0)."""

    def gradients(self) -> bytearray:
        """This stage's gradients, flat, to all-reduce across replicas."""

    def add_into(self, target: memoryview, incoming: bytes | bytearray) -> None:
        """target += incoming, element-wise (the all-reduce's reduction)."""

    def apply_reduced(self, reduced: bytearray, replicas: int) -> None:
        """Take the all-reduced gradients (a sum over replicas) as this stage's gradients."""

    def step(self) -> None:
        """Optimizer step, then clear gradients for the next iteration."""

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
    grad_bytes: int
    first: bool
    last: bool

    def __post_init__(self) -> None:
        self._activation = bytes(self.activation_bytes)
        self._grads: bytearray | None = None  # GBs for large stages: only when sent

    def forward(self, iteration: int, microbatch: int, received: bytearray | None) -> bytes | None:
        time.sleep(self.forward_s)
        return None if self.last else self._activation

    def backward(self, iteration: int, microbatch: int, received: bytearray | None) -> bytes | None:
        time.sleep(self.backward_s)
        return None if self.first else self._activation

    def gradients(self) -> bytearray:
        if self._grads is None:
            self._grads = bytearray(self.grad_bytes)
        return self._grads

    def add_into(self, target: memoryview, incoming: bytes | bytearray) -> None:
        """Nothing to add: the bytes are placeholders; only their size and timing matter."""

    def apply_reduced(self, reduced: bytearray, replicas: int) -> None:
        self._grads = reduced

    def step(self) -> None:
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
