"""The worker transport: bit-identical delivery over any number of connections."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.emulator.runtime.wire.protocol import chunks
from testbed.emulator.runtime.worker.collectives.allreduce import chunk_bounds
from testbed.emulator.runtime.worker.transport.transport import PeerLost, Transport

TOKEN = b"t" * 32
DTYPES = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int8,
    torch.bool,
    torch.float64,
]


async def _pair(connections: int) -> tuple[Transport, Transport]:
    a, b = Transport(0, TOKEN), Transport(1, TOKEN)
    port = await b.listen("127.0.0.1", 0)
    await asyncio.gather(
        a.connect({1: ("127.0.0.1", port, connections)}, {}), b.connect({}, {0: connections})
    )
    return a, b


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(st.lists(st.integers(0, 17), min_size=0, max_size=3))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31)))
    if dtype is torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype in (torch.int64, torch.int8):
        return torch.randint(-100, 100, shape, generator=generator).to(dtype)
    return torch.randn(shape, generator=generator).to(dtype)


def _bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


@settings(max_examples=40)
@given(st.lists(tensors(), min_size=1, max_size=4), st.integers(1, 9))
def test_any_tensor_arrives_bit_identical(items: list[torch.Tensor], connections: int) -> None:
    async def scenario() -> list[bytes]:
        a, b = await _pair(connections)
        try:
            sends = [a.send(1, f"t{i}", _bytes(t)) for i, t in enumerate(items)]
            # receive in reverse order: tags, not order, match messages
            received = [b.recv(f"t{i}") for i in reversed(range(len(items)))]
            results = await asyncio.gather(*sends, *received)
            return [bytes(r.data) for r in results[len(items) :]][::-1]
        finally:
            await a.close()
            await b.close()

    got = asyncio.run(scenario())
    for tensor, data in zip(items, got, strict=True):
        assert data == _bytes(tensor)
        if tensor.numel():
            again = torch.frombuffer(bytearray(data), dtype=tensor.dtype).view(tensor.shape)
            assert torch.equal(again, tensor) or (again.isnan() == tensor.isnan()).all()


def test_large_message_over_many_connections() -> None:
    payload = torch.randn(3_000_000).numpy().tobytes()  # 12 MB, many chunks per connection

    async def scenario() -> bytes:
        a, b = await _pair(5)
        try:
            _, got = await asyncio.gather(a.send(1, "big", payload), b.recv("big"))
            return bytes(got.data)
        finally:
            await a.close()
            await b.close()

    assert asyncio.run(scenario()) == payload


def test_a_message_is_striped_evenly_over_its_connections() -> None:
    """Each of N connections carries about 1/N of a message (the plan's and the
    simulator's striping), not a send buffer each on the first few to write."""
    payload = bytes(16 * 2**20)
    connections = 8

    async def scenario() -> list[int]:
        a, b = await _pair(connections)
        try:
            await asyncio.gather(a.send(1, "big", payload), b.recv("big"))
            return [link.payload_bytes_written for link in a._links[1] if link is not None]
        finally:
            await a.close()
            await b.close()

    shares = asyncio.run(scenario())
    assert sum(shares) == len(payload) and len(shares) == connections
    fair = len(payload) / connections
    assert all(0.5 * fair <= share <= 1.5 * fair for share in shares), shares


def test_wrong_token_is_refused() -> None:
    async def scenario() -> None:
        b = Transport(1, TOKEN)
        port = await b.listen("127.0.0.1", 0)
        intruder = Transport(0, b"x" * 32)
        try:
            with pytest.raises((asyncio.TimeoutError, TimeoutError)):
                await asyncio.wait_for(
                    asyncio.gather(
                        intruder.connect({1: ("127.0.0.1", port, 1)}, {}), b.connect({}, {0: 1})
                    ),
                    1.0,
                )
        finally:
            await intruder.close()
            await b.close()

    asyncio.run(scenario())


def test_lost_peer_fails_pending_receive() -> None:
    async def scenario() -> None:
        a, b = await _pair(2)
        waiting = asyncio.ensure_future(b.recv("never"))
        await asyncio.sleep(0.05)
        await a.close()
        with pytest.raises(PeerLost):
            await asyncio.wait_for(waiting, 5)
        await b.close()

    asyncio.run(scenario())


@given(st.integers(0, 10**7), st.integers(1, 16))
def test_chunks_cover_the_message_exactly(total: int, connections: int) -> None:
    pieces = chunks(total, connections)
    assert pieces[0][0] == 0
    for (o1, l1), (o2, _) in itertools.pairwise(pieces):
        assert o1 + l1 == o2
    assert sum(length for _, length in pieces) == total
    if total >= connections * 64 * 1024:
        assert len(pieces) >= connections


@given(st.integers(4, 10**6), st.integers(1, 8))
def test_allreduce_chunks_are_whole_elements(total: int, parts: int) -> None:
    bounds = chunk_bounds(total - total % 4, parts)
    assert bounds[0][0] == 0 and bounds[-1][1] == total - total % 4
    assert all(start % 4 == 0 for start, _ in bounds)


def test_strangers_are_dropped_without_touching_the_run() -> None:
    """A connection that never proves the run's secret (closed at once, garbage, a wrong
    token) is dropped; the peers' own traffic goes on."""
    from testbed.emulator.runtime.wire.protocol import pack_hello

    async def stranger(port: int, payload: bytes) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        if payload:
            writer.write(payload)
            await writer.drain()
        with contextlib.suppress(ConnectionError, TimeoutError):
            await asyncio.wait_for(reader.read(), 0.3)  # dropped, or left hanging
        writer.close()

    async def scenario() -> bytes:
        a, b = Transport(0, TOKEN), Transport(1, TOKEN)
        port = await b.listen("127.0.0.1", 0)
        await asyncio.gather(a.connect({1: ("127.0.0.1", port, 2)}, {}),
                             b.connect({}, {0: 2}))
        try:
            for payload in (b"", b"GET / HTTP/1.0\r\n\r\n" * 10, pack_hello(b"x" * 32, 0, 0),
                            pack_hello(b"x" * 32, 0, 5) + b"junk"):
                await stranger(port, payload)
            await a.send(1, "m", b"still here")
            got = await asyncio.wait_for(b.recv("m"), 5)
            return bytes(got.data)
        finally:
            await a.close()
            await b.close()

    assert asyncio.run(scenario()) == b"still here"


def test_acknowledged_waits_until_the_receiving_host_has_every_byte() -> None:
    """With the receiver not reading, its window closes and the bytes stay queued at the
    sender: the wait must not end until they have been taken and acknowledged."""
    payload = bytes(2 * 2**20)

    async def scenario() -> None:
        a, b = await _pair(2)
        try:
            inbound = [link for link in b._links[0] if link is not None]
            for link in inbound:
                assert link.transport is not None
                link.transport.pause_reading()
            sending = asyncio.create_task(a.send(1, "held", payload))
            await asyncio.sleep(0.2)
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(a.acknowledged(1), 0.3)
            for link in inbound:
                assert link.transport is not None
                link.transport.resume_reading()
            await sending
            await asyncio.wait_for(a.acknowledged(1), 5)
            got = await asyncio.wait_for(b.recv("held"), 5)
            assert len(got.data) == len(payload)
        finally:
            await a.close()
            await b.close()

    asyncio.run(scenario())


def test_a_message_is_timed_when_it_arrives_not_when_it_is_received() -> None:
    """A receive that comes late must see the message's real arrival: what the bubble
    predictions and the overrun count measure waits by."""

    async def scenario() -> tuple[float, float]:
        a, b = await _pair(1)
        try:
            await a.send(1, "early", b"x" * 1000)
            await asyncio.sleep(0.3)
            asked = time.monotonic()
            got = await b.recv("early")
            return asked, got.completed_at
        finally:
            await a.close()
            await b.close()

    asked, arrived = asyncio.run(scenario())
    assert arrived < asked - 0.2


def test_a_wait_for_acknowledgement_looks_a_few_dozen_times_not_a_thousand(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A send queue that drains steadily for half a second, as a paced message's last
    bytes on a slow link do (a stand-in for the kernel's count, so the drain is the same
    on any machine): the wait used to look every 0.5 ms, up to a thousand times, a cost
    every worker waiting out a slow link paid. It looks a few dozen times, and not once
    after the queue is empty."""
    import testbed.emulator.runtime.worker.transport.transport as transport

    looks: list[int] = []
    began = time.monotonic()

    def draining(link: asyncio.Transport | None) -> int:
        queued = max(0, int(10**6 * (1 - (time.monotonic() - began) / 0.5)))
        looks.append(queued)
        return queued

    async def scenario() -> None:
        nonlocal began
        a, b = await _pair(1)
        try:
            monkeypatch.setattr(transport, "unacknowledged_bytes", draining)
            began = time.monotonic()
            await asyncio.wait_for(a.acknowledged(1), 5)
        finally:
            monkeypatch.undo()
            await a.close()
            await b.close()

    asyncio.run(scenario())
    assert looks[-1] == 0 and 0 not in looks[:-1]
    assert len(looks) <= 40, len(looks)


def test_how_long_a_wait_for_acknowledgement_sleeps() -> None:
    from testbed.emulator.runtime.worker.transport.send_queue import (
        ACK_POLL_S,
        ACK_STALLED_MAX_S,
        ack_poll_delay,
    )

    assert ack_poll_delay(1000, 0, 0.0, 0.0) == ACK_POLL_S  # the first look comes soon
    # 1 MB left, draining 1 MB per 0.1 s: a quarter of the 0.1 s left
    assert ack_poll_delay(10**6, 2 * 10**6, 0.1, ACK_POLL_S) == pytest.approx(0.02)
    assert ack_poll_delay(10**4, 2 * 10**6, 0.1, ACK_POLL_S) == ACK_POLL_S  # almost done
    # nothing drained (a window's worth awaits its acknowledgement): back off, a little
    delays = [ACK_POLL_S]
    for _ in range(5):
        delays.append(ack_poll_delay(5000, 5000, delays[-1], delays[-1]))
    assert delays == [0.0005, 0.001, 0.002, 0.002, 0.002, 0.002]
    assert max(delays) == ACK_STALLED_MAX_S


def test_the_probe_starts_each_message_on_its_schedule(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """`probe send --at T --every S` starts message i at T + i x S whatever the ones before
    took, so that senders in several namespaces start each round together."""
    from testbed.emulator.runtime.coordinator import probe

    with socket.socket() as free:  # a port nothing listens on
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]

    async def both() -> float:
        server = asyncio.ensure_future(probe.serve("127.0.0.1", port, 1, 3))
        await asyncio.sleep(0.1)
        at = time.monotonic() + 0.2
        await probe.send("127.0.0.1", port, 1, 3, 1000, at=at, every_s=0.3)
        done = time.monotonic()
        await server
        return done - at

    took = asyncio.run(both())
    assert took >= 0.6  # the third message started no sooner than at + 2 x every
    assert len(capsys.readouterr().out.splitlines()) == 3
