"""Collectives of a stage's replicas over the worker transport: a ring all-reduce, or a
ring all-gather where every member's payload must arrive as it was sent (compressed
gradients with error feedback, top-k pairs: testbed.plan.collective.Collective.gathers).

The ring: reduce-scatter then all-gather, n-1 steps each; every member sends and receives
2(n-1)/n of its payload, the bandwidth-optimal pattern NCCL and gloo use. What a chunk is
on the wire and how a received one adds in is the member's Contribution's business: raw
bytes whose content does not matter (emulated compute), fp32 values, or quantized ones
that each hop dequantizes, adds in fp32 and requantizes
(testbed.emulator.runtime.worker.collectives.payloads).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol

Wire = bytes | bytearray | memoryview
Received = Wire | None
"""A tensor from the neighbouring stage: off the network (None where the transport keeps
only sizes), or handed over on this GPU."""
Send = Callable[[str, Wire], Awaitable[object]]
"""Send a message with this tag to the ring's successor."""
Receive = Callable[[str], Awaitable[Wire]]
"""The message with this tag from the ring's predecessor."""

ELEMENT = 4


def chunk_bounds(total: int, parts: int, unit: int = ELEMENT) -> list[tuple[int, int]]:
    """(start, end) of `parts` chunks of `total`, each starting at a multiple of `unit`:
    whole units as even as possible (the first chunks take the spare ones), the last
    chunk also the part of a unit left over."""
    base, extra = divmod(total // unit, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + (base + (1 if i < extra else 0)) * unit
        bounds.append((start, end))
        start = end
    last_start, _ = bounds[-1]
    bounds[-1] = (last_start, total)
    return bounds


class Contribution(Protocol):
    """One member's side of one collective."""

    def wire(self, chunk: int) -> Wire:
        """Chunk `chunk` of what this member holds so far, as it goes on the wire."""

    def add(self, chunk: int, data: Wire) -> None:
        """Add a predecessor's partial sum of chunk `chunk` into this member's."""

    def settle(self, chunk: int) -> Wire:
        """The chunk this member finished reducing, as it goes on the wire; the member
        takes that value as its own, as every other member will."""

    def take(self, chunk: int, data: Wire) -> None:
        """The reduced chunk `chunk`, from the member that settled it."""

    def whole(self) -> Wire:
        """Everything this member contributes (a gathered collective)."""

    def gathered(self, payloads: list[Wire]) -> None:
        """Every member's `whole()`, in ring order (this member's own among them)."""


async def ring_allreduce(contribution: Contribution, position: int, size: int, tag: str,
                         send: Send, receive: Receive) -> None:
    """Sum the members' contributions; each ends up holding the sum. Chunk i is settled
    by member (i - 1) mod size."""
    if size == 1:
        return
    for step in range(size - 1):  # reduce-scatter
        out_chunk = (position - step) % size
        in_chunk = (position - step - 1) % size
        sending = asyncio.ensure_future(send(f"{tag}:rs{step}", contribution.wire(out_chunk)))
        received = await receive(f"{tag}:rs{step}")
        await sending
        contribution.add(in_chunk, received)
    forward: Wire = contribution.settle((position + 1) % size)
    for step in range(size - 1):  # all-gather: settled chunks go round as they are
        in_chunk = (position - step) % size
        sending = asyncio.ensure_future(send(f"{tag}:ag{step}", forward))
        received = await receive(f"{tag}:ag{step}")
        await sending
        contribution.take(in_chunk, received)
        forward = received


async def ring_allgather(contribution: Contribution, position: int, size: int, tag: str,
                         send: Send, receive: Receive) -> None:
    """Every member's whole contribution to every member: n-1 steps, each passing on the
    one received in the step before (its own first). A group of one moves nothing."""
    if size == 1:
        return
    payloads: list[Wire] = [b""] * size
    mine = contribution.whole()
    payloads[position] = mine
    forward: Wire = mine
    for step in range(size - 1):
        sending = asyncio.ensure_future(send(f"{tag}:ag{step}", forward))
        received = await receive(f"{tag}:ag{step}")
        await sending
        payloads[(position - step - 1) % size] = received
        forward = received
    contribution.gathered(payloads)


class Bytes:
    """A contribution whose bytes only take their time on the wire (emulated compute):
    `nbytes` of zeros, split as a ring splits them, nothing added."""

    def __init__(self, buffer: Wire, parts: int) -> None:
        self.view = memoryview(buffer)
        self.bounds = chunk_bounds(len(buffer), parts)

    def wire(self, chunk: int) -> Wire:
        start, end = self.bounds[chunk]
        return self.view[start:end]

    def add(self, chunk: int, data: Wire) -> None:
        """Placeholders: only their size and timing matter."""

    def settle(self, chunk: int) -> Wire:
        return self.wire(chunk)

    def take(self, chunk: int, data: Wire) -> None:
        """Nothing to keep."""

    def whole(self) -> Wire:
        return self.view

    def gathered(self, payloads: list[Wire]) -> None:
        """Nothing to sum."""
