"""The coordinator's control socket: who may join (the run's workers, proving its secret,
each on its own hello clock), and the start-up exchange that brings them to the start line.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from testbed.emulator.runtime.coordinator.failure import Failure, RunFailed
from testbed.emulator.runtime.coordinator.pool import WorkerHandle
from testbed.emulator.runtime.wire.messages import (
    Config,
    Connect,
    Hello,
    Listening,
    Message,
    Ready,
    WorkerError,
    decode_as,
    receive,
)
from testbed.emulator.runtime.wire.protocol import MAX_UNPROVEN_BYTES, ProtocolError, read_message

HELLO_TIMEOUT_S = 5.0
"""How long a new control connection may take to say hello."""
Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


class ControlServer:
    def __init__(self, token: str) -> None:
        self.token = token
        self.hellos: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                         Hello]] = asyncio.Queue()
        """Connections that said hello in time, with what they said."""
        self.closed_to_newcomers = False
        self._server: asyncio.AbstractServer | None = None

    async def listen(self, path: Path) -> None:
        self._server = await asyncio.start_unix_server(self.on_connect, path=str(path))
        os.chmod(path, 0o600)

    def close(self) -> None:
        if self._server is not None:
            self._server.close()

    async def on_connect(self, reader: asyncio.StreamReader,
                         writer: asyncio.StreamWriter) -> None:
        if self.closed_to_newcomers:
            writer.close()  # every worker has joined: nobody else may
            return
        try:  # each connection on its own clock: a silent one holds up nobody
            raw = await asyncio.wait_for(read_message(reader, MAX_UNPROVEN_BYTES),
                                         HELLO_TIMEOUT_S)
            hello = decode_as(raw, Hello)
        except (TimeoutError, asyncio.IncompleteReadError, ValueError, ProtocolError,
                ConnectionError):
            writer.close()  # not our protocol: not one of ours
            return
        await self.hellos.put((reader, writer, hello))

    async def handshake(self, workers: list[WorkerHandle], decoders: list[WorkerHandle],
                        config_for: Callable[[WorkerHandle], Config],
                        connections_for: Callable[[WorkerHandle], Connect],
                        failure: Failure) -> None:
        """hello (all) -> config -> listening -> connect -> ready: every data connection
        open before training starts."""
        by_gpu = {w.gpu: w for w in [*workers, *decoders]}
        waiting = set(by_gpu)
        while waiting:
            reader, writer, hello = await failure.race(self.hellos.get())
            worker = by_gpu.get(hello.gpu)
            if worker is None or worker.gpu not in waiting or not secrets.compare_digest(
                    hello.token.encode(), self.token.encode()):
                writer.close()  # not one of this run's workers
                continue
            worker.reader, worker.writer, worker.pid = reader, writer, hello.pid
            waiting.discard(worker.gpu)
            if not worker.decoder:
                await worker.tell(config_for(worker))
        for decoder in decoders:
            await failure.race(read_from(decoder, failure, Listening))
        for worker in workers:
            listening = await failure.race(read_from(worker, failure, Listening))
            assert isinstance(listening, Listening)
            worker.port = listening.port
        for worker in workers:
            await worker.tell(connections_for(worker))
        for worker in workers:
            await failure.race(read_from(worker, failure, Ready))
        self.closed_to_newcomers = True


async def read_from(worker: WorkerHandle, failure: Failure,
                    *expected: type[Message]) -> Message:
    """The worker's next message; RunFailed if it reports an error, closes its connection
    (naming the exit once the process watcher has), or says something unexpected."""
    assert worker.reader is not None
    try:
        message = await receive(worker.reader, *expected, WorkerError)
    except (asyncio.IncompleteReadError, OSError):
        await asyncio.sleep(0.5)  # let the process watcher name the exit code
        if failure.reason is not None:
            raise RunFailed(failure.reason) from None
        raise RunFailed(f"worker {worker.describe()} closed its control connection: "
                        f"{worker.last_log_line() or 'no output'}") from None
    except ProtocolError as exc:
        raise RunFailed(f"worker {worker.describe()}: {exc}") from None
    if isinstance(message, WorkerError):
        raise RunFailed(f"worker {worker.describe()}: {message.message}")
    return message
