"""A decode server: receives prefilled requests' KV caches (and first tokens) from the
training GPUs over TCP, and tells the coordinator when each has fully arrived: that is the
request's time to first token. Runs in its own namespace in a datacenter."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import struct
import sys

from testbed.emulator.runtime.wire.join_messages import LinkChange
from testbed.emulator.runtime.wire.messages import Hello, KvDelivered, Listening, decode, send
from testbed.emulator.runtime.wire.protocol import TOKEN_ENV, ProtocolError, read_message
from testbed.emulator.runtime.worker.share_events import LinkChanger, apply_link_change
from testbed.emulator.runtime.worker.stopping import until_signalled
from testbed.emulator.runtime.worker.transport import clock

HEADER = struct.Struct("!QQd")  # request id, KV bytes, sender's clock
DECODE_PORT = 7100


async def write_kv(writer: asyncio.StreamWriter, request: int, payload: bytes) -> None:
    """The sender's half: one request's KV cache, framed."""
    writer.write(HEADER.pack(request, len(payload), clock.now()))
    if payload:
        writer.write(payload)
    await writer.drain()


async def serve(control_path: str, name: str, token: str, address: str, port: int) -> None:
    control_reader, control = await asyncio.open_unix_connection(control_path)
    await serve_on(control_reader, control, name, token, address, port)


async def serve_on(control_reader: asyncio.StreamReader, control: asyncio.StreamWriter,
                   name: str, token: str, address: str, port: int,
                   links: LinkChanger | None = None) -> None:
    """The decode server's life on an open control connection (network events for this
    machine's share too, when it holds it)."""
    await send(control, Hello(name, token, os.getpid(), role="decode"))
    lock = asyncio.Lock()

    async def on_sender(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                request, size, _sent = HEADER.unpack(await reader.readexactly(HEADER.size))
                remaining = size
                while remaining:
                    chunk = await reader.read(min(remaining, 1 << 20))
                    if not chunk:
                        raise asyncio.IncompleteReadError(b"", remaining)
                    remaining -= len(chunk)
                async with lock:
                    await send(control, KvDelivered(request, clock.now(), size))
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(on_sender, address, port)
    await send(control, Listening(port))
    try:
        while True:  # until "stop" (or anything else), or the coordinator goes away
            order = decode(await read_message(control_reader))
            if links is None or not isinstance(order, LinkChange):
                break
            await apply_link_change(links, order, control)
    except (asyncio.IncompleteReadError, OSError, ProtocolError):
        pass
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()


def main() -> None:
    parser = argparse.ArgumentParser(description="testbed decode server (started by a run)")
    parser.add_argument("--control", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--address", required=True)
    parser.add_argument("--port", type=int, default=DECODE_PORT)
    args = parser.parse_args()
    token = os.environ.pop(TOKEN_ENV, "")
    try:
        code = asyncio.run(until_signalled(
            serve(args.control, args.name, token, args.address, args.port)))
    except Exception as exc:
        print(f"decode {args.name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    if code is not None:
        sys.exit(code)
    print(json.dumps({"stopped": args.name}), flush=True)


if __name__ == "__main__":
    main()
