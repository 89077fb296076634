"""Ring all-reduce of a stage's gradients across its replicas, over the worker transport.

Reduce-scatter then all-gather, n-1 steps each: every worker sends and receives 2(n-1)/n of
the gradient bytes, the bandwidth-optimal pattern NCCL and gloo use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from testbed.runtime.engines import Engine
from testbed.runtime.transport import Transport

ELEMENT = 4


def chunk_bounds(total: int, parts: int) -> list[tuple[int, int]]:
    """(start, end) byte ranges of `parts` chunks, each a whole number of 4-byte elements."""
    elements = total // ELEMENT
    base, extra = divmod(elements, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + (base + (1 if i < extra else 0)) * ELEMENT
        bounds.append((start, end))
        start = end
    last_start, _ = bounds[-1]
    bounds[-1] = (last_start, total)
    return bounds


async def ring_allreduce(
    transport: Transport,
    engine: Engine,
    data: bytearray,
    position: int,
    size: int,
    send_to: int,
    tag: str,
    send: Callable[[int, str, memoryview], Awaitable[object]] | None = None,
) -> bytearray:
    """Sum `data` across the `size` members of the ring; returns the summed buffer."""
    if size == 1:
        return data
    sender = send or transport.send
    view = memoryview(data)
    bounds = chunk_bounds(len(data), size)
    for step in range(size - 1):  # reduce-scatter
        out_chunk = (position - step) % size
        in_chunk = (position - step - 1) % size
        start, end = bounds[out_chunk]
        sending = asyncio.ensure_future(sender(send_to, f"{tag}:rs{step}", view[start:end]))
        received = await transport.recv(f"{tag}:rs{step}")
        await sending
        start, end = bounds[in_chunk]
        engine.add_into(view[start:end], received.data)
    for step in range(size - 1):  # all-gather
        out_chunk = (position - step + 1) % size
        in_chunk = (position - step) % size
        start, end = bounds[out_chunk]
        sending = asyncio.ensure_future(sender(send_to, f"{tag}:ag{step}", view[start:end]))
        received = await transport.recv(f"{tag}:ag{step}")
        await sending
        start, end = bounds[in_chunk]
        view[start:end] = received.data
    return data
