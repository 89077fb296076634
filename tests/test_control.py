"""The coordinator's control socket, without a network: who gets in and how fast."""

from __future__ import annotations

import asyncio
import json
import logging
import struct
import time
from pathlib import Path

import pytest

from testbed.emulator.runtime.coordinator.control_server import ControlServer
from testbed.emulator.runtime.wire.messages import Hello
from testbed.emulator.runtime.wire.protocol import MAX_UNPROVEN_BYTES, send_message


def test_silent_connections_do_not_hold_up_a_hello(tmp_path: Path) -> None:
    """Three connections that never speak, then a worker's hello: the hello is queued at
    once, not after the silent ones time out."""

    async def scenario() -> float:
        control = ControlServer("x")
        path = str(tmp_path / "control.sock")
        server = await asyncio.start_unix_server(control.on_connect, path=path)
        silent = [await asyncio.open_unix_connection(path) for _ in range(3)]
        started = time.monotonic()
        _, writer = await asyncio.open_unix_connection(path)
        await send_message(writer, {"op": "hello", "gpu": "east-0", "token": "x"})
        _, _, msg = await asyncio.wait_for(control.hellos.get(), 3)
        took = time.monotonic() - started
        assert msg == Hello("east-0", "x")
        for _, w in silent:
            w.close()
        writer.close()
        server.close()
        return took

    assert asyncio.run(scenario()) < 2.0


def _frame(body: bytes) -> bytes:
    return struct.pack("!I", len(body)) + body


HELLO = json.dumps({"op": "hello", "gpu": "east-0", "token": "x"}).encode()


@pytest.mark.parametrize("data", [
    b"\xff\xff\xff\xffnot json",
    _frame(b"[" * 4000),  # deeper than json's recursion limit
    _frame(HELLO.ljust(MAX_UNPROVEN_BYTES + 1)),  # a good hello, but longer than the bound
], ids=["huge length", "deep nesting", "a hello past the bound"])
def test_garbage_on_the_control_socket_is_dropped(
        tmp_path: Path, data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> bool:
        control = ControlServer("x")
        path = str(tmp_path / "control.sock")
        server = await asyncio.start_unix_server(control.on_connect, path=path)
        reader, writer = await asyncio.open_unix_connection(path)
        writer.write(data)
        await writer.drain()
        closed = await asyncio.wait_for(reader.read(), 3) == b""
        server.close()
        return closed and control.hellos.empty()

    assert asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
