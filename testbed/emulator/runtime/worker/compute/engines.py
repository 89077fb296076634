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

from testbed.emulator.runtime.worker.collectives.allreduce import (
    Bytes,
    Contribution,
    Received,
    Wire,
)
from testbed.emulator.runtime.worker.collectives.in_backward import InBackward
from testbed.emulator.runtime.worker.compute.zeros import zeros

if TYPE_CHECKING:
    from testbed.emulator.runtime.wire.messages import Config, EmulatedTiming, PrefillPart
    from testbed.plan.collective import Collective

class Engine(Protocol):
    """One stage's compute (a worker holding several stages has one engine for each)."""

    def forward(self, iteration: int, microbatch: int, received: Received) -> Wire | None:
        """Run the forward; return the activations to send on (None on the last stage)."""

    def backward(self, iteration: int, microbatch: int, received: Received,
                 starts: Sequence[InBackward] = ()) -> Wire | None:
        """Run the backward; return the input gradient to send back (None on stage 0).
        `starts`: the all-reduces that start in it, each once it has their values."""

    def input_gradient(self, iteration: int, microbatch: int, received: Received
                       ) -> Wire | None:
        """A split backward's first half (I): the input gradient to send back (None on
        stage 0), keeping what the weight gradient needs."""

    def weight_gradient(self, iteration: int, microbatch: int,
                        starts: Sequence[InBackward] = ()) -> None:
        """A split backward's second half (W), after the microbatch's input gradient: the
        weights' gradients, accumulated as a whole backward accumulates them; `starts` as
        for `backward`."""

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

    def iteration_done(self, iteration: int) -> None:
        """The iteration's program has run (a cycle's end keeps the synchronized model)."""

    def synced_at(self) -> list[int]:
        """The iterations whose synchronized model this stage kept to evaluate after
        training (testbed.emulator.runtime.worker.synced_loss); none but in the DiLoCo family."""

    def evaluate(self, iteration: int, replica: int, microbatch: int, received: Received
                 ) -> Wire | float:
        """The synchronized model kept for `iteration` on that iteration's microbatch of
        `replica`: activations to send on, or the loss on the last stage."""

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
    """Holds the GPU busy for modeled times; sends zeros of the real size that take no
    memory (testbed.emulator.runtime.worker.compute.zeros), and reads nothing it receives."""

    timing: EmulatedTiming
    activation_bytes: int
    first: bool
    last: bool

    def forward(self, iteration: int, microbatch: int, received: Received) -> Wire | None:
        time.sleep(self.timing.forward_s)
        return None if self.last else zeros(self.activation_bytes)

    def backward(self, iteration: int, microbatch: int, received: Received,
                 starts: Sequence[InBackward] = ()) -> Wire | None:
        _busy(self.timing.backward_s, starts)
        return None if self.first else zeros(self.activation_bytes)

    def input_gradient(self, iteration: int, microbatch: int, received: Received
                       ) -> Wire | None:
        time.sleep(self.timing.input_s)
        return None if self.first else zeros(self.activation_bytes)

    def weight_gradient(self, iteration: int, microbatch: int,
                        starts: Sequence[InBackward] = ()) -> None:
        _busy(self.timing.weight_s, starts)

    def contribute(self, collective: Collective, nbytes: int, members: int) -> Contribution:
        """Zeros of the planned size (GBs for large stages, held in no memory)."""
        return Bytes(zeros(nbytes), members)

    def reduced(self, collective: Collective, contribution: Contribution,
                members: int) -> None:
        """Nothing to take: the bytes are placeholders."""

    def step(self) -> None:
        time.sleep(self.timing.step_s)

    def outer_step(self, collective: Collective) -> None:
        time.sleep(self.timing.step_s)

    def take_loss(self) -> float | None:
        return None

    def iteration_done(self, iteration: int) -> None:
        """Nothing is kept."""

    def synced_at(self) -> list[int]:
        return []

    def evaluate(self, iteration: int, replica: int, microbatch: int, received: Received
                 ) -> Wire | float:
        raise RuntimeError("emulated compute has no model to evaluate")

    def save(self, path: str) -> None:
        """Emulated stages have no parameters to save."""

    def checkpoint(self, path: str) -> None:
        """Nor state to resume: the iteration count is all."""

    def restore(self, path: str) -> None:
        """Nothing was saved."""

    def quick(self) -> bool:
        t = self.timing
        return max(t.forward_s, t.backward_s, t.input_s, t.weight_s, t.step_s) < QUICK_S

    def prefill(self, parts: Sequence[PrefillPart], modeled_s: float) -> dict[int, bytes]:
        time.sleep(modeled_s)
        return {part.request: bytes(part.kv_bytes) for part in parts if part.last}


def _busy(seconds: float, starts: Sequence[InBackward]) -> None:
    """Hold the GPU `seconds`, starting each all-reduce as that far into it as its values
    are there (in order: none before the one before it), with zeros of its size."""
    began = time.monotonic()
    for start in starts:
        left = began + start.ready * seconds - time.monotonic()
        if left > 0:
            time.sleep(left)
        start.started(Bytes(zeros(start.nbytes), start.members))
    left = began + seconds - time.monotonic()
    if left > 0:
        time.sleep(left)


def make_engines(config: Config) -> dict[int, Engine]:
    """An engine for each stage the worker holds."""
    if config.compute == "real":
        from testbed.emulator.runtime.worker.compute.real_engine import (
            real_engines,  # emulated workers never load torch
        )

        return dict(real_engines(config))
    return {stage: EmulatedEngine(config.emulated[str(stage)], config.activation_bytes,
                                  stage == 0, stage == config.pp - 1)
            for stage in config.stages}
