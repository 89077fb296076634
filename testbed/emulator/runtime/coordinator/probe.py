"""Time one striped transfer between two namespaces with the worker transport.

`serve` (in the receiver's namespace) waits for N connections and the messages; `send`
(in the sender's namespace) stripes each message over its N connections and prints one JSON
line per message: bytes and seconds from the first byte sent to the receiver having the
whole message (the receiver reports when; one machine, one clock).
Used by the transport tests and benchmark.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import subprocess
import sys
import time
from typing import Any

from testbed.emulator.runtime.worker.process import run_loop
from testbed.emulator.runtime.worker.transport.transport import Transport

PROBE_TOKEN = b"testbed-transport-probe".ljust(32, b"\0")
PORT = 29400
"""Where `serve` listens unless `--port` says."""


async def serve(address: str, port: int, connections: int, messages: int,
                pace_bps: float = 0.0) -> None:
    transport = Transport(1, PROBE_TOKEN, _pacing(0, connections, pace_bps))
    await transport.listen(address, port)
    await transport.connect({}, {0: connections})
    for i in range(messages):
        got = await transport.recv(f"m{i}")
        await transport.send(0, f"ack{i}", struct.pack("!d", got.completed_at))
    await asyncio.sleep(0.2)
    await transport.close()


def _pacing(peer: int, connections: int, pace_bps: float) -> dict[int, float]:
    """Each connection's share of the pair's rate, in bytes per second."""
    return {peer: pace_bps / 8 / connections} if pace_bps > 0 else {}


async def send(address: str, port: int, connections: int, messages: int, size: int,
               pace_bps: float = 0.0, gap_s: float = 0.0, at: float = 0.0,
               every_s: float = 0.0) -> None:
    """`gap_s`: idle between one message's arrival and the next; or, with `every_s`,
    message i starts at monotonic time `at` + i x `every_s` (senders in several
    namespaces keep one schedule: one machine, one clock)."""
    transport = Transport(0, PROBE_TOKEN, _pacing(1, connections, pace_bps))
    await transport.connect({1: (address, port, connections)}, {})
    payload = bytes(size)
    for i in range(messages):
        if every_s:
            await asyncio.sleep(max(0.0, at + i * every_s - time.monotonic()))
        elif i and gap_s:
            await asyncio.sleep(gap_s)
        started = time.monotonic()
        await transport.send(1, f"m{i}", payload)
        ack = await transport.recv(f"ack{i}")
        assert ack.data is not None  # this transport keeps payloads
        (completed,) = struct.unpack("!d", ack.data)
        print(
            json.dumps({"bytes": size, "seconds": completed - started, "connections": connections}),
            flush=True,
        )
    await transport.close()


def timed_messages(network: Any, src: str, dst: str, connections: int, messages: int,
                   size: int, pace_bps: float = 0.0, gap_s: float = 0.0,
                   timeout_s: float = 300.0, at: float = 0.0,
                   every_s: float = 0.0) -> list[float]:
    """Seconds each of `messages` striped messages of `size` bytes takes from node `src`
    to node `dst` of a running network (a serve and a send process in their namespaces);
    `at` and `every_s`: the send's schedule (`send`)."""
    sender, receiver = network.layout.node(src), network.layout.node(dst)
    common = ["--connections", str(connections), "--messages", str(messages),
              "--pace", str(pace_bps)]
    module = [sys.executable, "-m", "testbed.emulator.runtime.coordinator.probe"]
    server = subprocess.Popen(["ip", "netns", "exec", receiver.netns, *module, "serve",
                               receiver.address, *common], stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        sent = subprocess.run(["ip", "netns", "exec", sender.netns, *module, "send",
                               receiver.address, *common, "--bytes", str(size), "--gap",
                               str(gap_s), "--at", str(at), "--every", str(every_s)],
                              capture_output=True, text=True,
                              timeout=timeout_s, check=True)
    finally:
        server.wait(timeout=60)
    return [float(json.loads(line)["seconds"]) for line in sent.stdout.splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("role", choices=["serve", "send"])
    parser.add_argument("address")
    parser.add_argument("--port", type=int, default=PORT)
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--messages", type=int, default=1)
    parser.add_argument("--bytes", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--pace", type=float, default=0.0,
                        help="the pair's rate in bit/s, shared by its connections (0: unpaced)")
    parser.add_argument("--gap", type=float, default=0.0, help="seconds idle between messages")
    parser.add_argument("--at", type=float, default=0.0,
                        help="with --every: the monotonic time the first message starts")
    parser.add_argument("--every", type=float, default=0.0,
                        help="seconds from one message's start to the next's (not --gap)")
    args = parser.parse_args()
    if args.role == "serve":
        run_loop(serve(args.address, args.port, args.connections, args.messages, args.pace))
    else:
        run_loop(send(args.address, args.port, args.connections, args.messages, args.bytes,
                      args.pace, args.gap, args.at, args.every))


if __name__ == "__main__":
    main()
