"""A stand-in worker process for the coordinator's tests: speaks the real control
protocol, moves no data, and misbehaves on request (FAKE_WORKERS: JSON by GPU name).

Behaviours: {"die_at": N} exits with code 3 in iteration N; {"stall_at": N} stops
reporting in iteration N; {"kill_at": N} SIGKILLs itself; {"grow_at": N, "mb": M} grows
by M MiB (written, so resident) and holds them (with "release": true, frees them and goes
on); {"requests": [[tag, replica, microbatch],
...]} asks for those WAN transfers in iteration 0, sending each as soon as it is granted,
and writes the grant order to {"grants_to": FILE}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from typing import Any

from testbed.emulator.runtime.wire.arbitration import Grant, Sent, TransferRequest
from testbed.emulator.runtime.wire.messages import (
    Config,
    Connect,
    Done,
    Hello,
    IterationDone,
    Listening,
    Ready,
    Start,
    Stop,
    receive,
    send,
)
from testbed.emulator.runtime.wire.protocol import TOKEN_ENV


async def transfers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    config: Config, wanted: list[list[Any]], order_file: str) -> None:
    for tag, replica, microbatch in wanted:
        await send(writer, TransferRequest(
            tag=tag, link="east>west", src=config.gpu, dst="west-0", kind="SEND_F",
            replica=replica, stage=0, microbatch=microbatch, nbytes=1000, iteration=0,
            ready_at=time.monotonic()))
    granted: list[str] = []
    while len(granted) < len(wanted):
        message = await receive(reader, Grant)
        assert isinstance(message, Grant)
        granted.append(message.tag)
        await send(writer, Sent(message.tag))
    with open(order_file, "w") as out:
        json.dump(granted, out)


async def serve(control: str, gpu: str, token: str, behaviour: dict[str, Any]) -> int:
    reader, writer = await asyncio.open_unix_connection(control)
    await send(writer, Hello(gpu, token, os.getpid()))
    config = await receive(reader, Config)
    assert isinstance(config, Config)
    await send(writer, Listening(40000 + config.index))
    await receive(reader, Connect)
    await send(writer, Ready())
    start = await receive(reader, Start)
    assert isinstance(start, Start)
    for iteration in range(config.first_iteration, config.iterations):
        if iteration == behaviour.get("die_at"):
            print(f"fake crash in iteration {iteration}", flush=True)
            return 3
        if iteration == behaviour.get("stall_at"):
            await asyncio.sleep(3600)
        if iteration == behaviour.get("kill_at"):
            os.kill(os.getpid(), signal.SIGKILL)
        if iteration == behaviour.get("grow_at"):
            hoard = []
            for _ in range(behaviour["mb"]):  # every page written: resident
                hoard.append(b"\1" * 2**20)
                await asyncio.sleep(0.005)
            if not behaviour.get("release"):
                await asyncio.sleep(3600)
            hoard.clear()
        if iteration == 0 and "requests" in behaviour:
            await transfers(reader, writer, config, behaviour["requests"],
                            behaviour["grants_to"])
        began = time.monotonic()
        await asyncio.sleep(0.01)
        span = {"gpu": gpu, "kind": "step", "start": began, "end": time.monotonic(),
                "iteration": iteration, "stage": config.stage}
        await send(writer, IterationDone(iteration, began, time.monotonic(), 1.0,
                                         [span]))  # type: ignore[list-item]
    await send(writer, Done(behaviour.get("synced", {})))
    await receive(reader, Stop)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--control", required=True)
    parser.add_argument("--gpu", required=True)
    args = parser.parse_args()
    behaviour = json.loads(os.environ.get("FAKE_WORKERS", "{}")).get(args.gpu, {})
    sys.exit(asyncio.run(serve(args.control, args.gpu, os.environ.pop(TOKEN_ENV, ""),
                               behaviour)))


if __name__ == "__main__":
    main()
