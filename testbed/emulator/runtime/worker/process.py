"""One worker process per GPU, started inside its host namespace by the coordinator.

It connects to the coordinator over a Unix socket (proving the run's secret), learns its
part of the plan, opens its data connections, has its stage runner (testbed.emulator.runtime.worker.
stage_runner) run its action list every iteration, and reports what it did and when (on
the machine-wide monotonic clock). Checkpoints, stop orders and the event loop's lag are
this module's; moving tensors is the stage runner's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from pathlib import Path
from typing import Any

from testbed.common.stats import percentile
from testbed.emulator.runtime.wire.arbitration import Grant
from testbed.emulator.runtime.wire.join_messages import LinkChange
from testbed.emulator.runtime.wire.messages import (
    Abort,
    CheckpointWritten,
    Config,
    Connect,
    Done,
    Hello,
    Idle,
    IterationDone,
    Listening,
    Prefill,
    Ready,
    Start,
    Stop,
    WorkerError,
    receive,
    receive_as,
    send,
)
from testbed.emulator.runtime.wire.protocol import TOKEN_ENV, ProtocolError
from testbed.emulator.runtime.worker.compute.engines import make_engines
from testbed.emulator.runtime.worker.share_events import LinkChanger, apply_link_change
from testbed.emulator.runtime.worker.stage_runner import StageRunner
from testbed.emulator.runtime.worker.stopping import leave, until_signalled
from testbed.emulator.runtime.worker.synced_loss import synced_losses
from testbed.emulator.runtime.worker.transport import clock
from testbed.emulator.runtime.worker.transport.transport import Transport
from testbed.errors import TestbedError, one_line
from testbed.run.checkpoint import checkpoint_due, iteration_dir, save_stage, stage_file


def make_transport(config: Config, token: bytes) -> Transport:
    """Emulated compute reads nothing it receives: its transport keeps sizes, not
    payloads, so a worker's memory does not grow with the messages in flight."""
    return Transport(config.index, token, keep_payloads=config.compute == "real")


async def control_loop(
    reader: asyncio.StreamReader,
    runner: StageRunner,
    stop: asyncio.Event,
    main_task: asyncio.Task[Any],
    links: LinkChanger | None = None,
) -> None:
    """Grants, prefill answers, network events for this machine's share and stop/abort
    orders from the coordinator, while the worker runs. Anything else from the
    coordinator is a protocol error: the run ends."""
    expected = (Grant, Prefill, Idle, Stop, Abort, *((LinkChange,) if links else ()))
    try:
        while True:
            match await receive(reader, *expected):
                case LinkChange() as change if links is not None:
                    await apply_link_change(links, change, runner.control)
                case Grant(tag=tag):
                    future = runner.grants.pop(tag, None)
                    if future is not None and not future.done():
                        future.set_result(None)
                case Prefill() | Idle() as answer:
                    reply = runner.bubble_reply
                    if reply is not None and not reply.done():
                        reply.set_result(answer)
                case Stop():
                    stop.set()
                case Abort():
                    main_task.cancel()
                    return
    except (asyncio.IncompleteReadError, OSError, ProtocolError):
        main_task.cancel()  # the coordinator is gone or speaks nonsense: so are we


async def serve(control_path: str, gpu: str, token: str) -> int:
    reader, writer = await asyncio.open_unix_connection(control_path)
    return await serve_on(reader, writer, gpu, token)


async def serve_on(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, gpu: str,
                   token: str, links: LinkChanger | None = None) -> int:
    """The worker's life on an open control connection (a Unix socket on the coordinator's
    machine, or TCP from another machine: testbed.emulator.runtime.worker.join)."""
    await send(writer, Hello(gpu, token, os.getpid()))
    config = await receive_as(reader, Config)
    transport = make_transport(config, bytes.fromhex(token))
    port = await transport.listen(config.address, 0)
    try:
        engines = await asyncio.get_running_loop().run_in_executor(None, make_engines, config)
    except Exception as exc:  # told by name, as the run's error (a data file not here)
        problem = str(exc) if isinstance(exc, TestbedError) else f"{type(exc).__name__}: {exc}"
        await send(writer, WorkerError(f"cannot start: {one_line(problem)[:400]}"))
        raise
    await send(writer, Listening(port))
    connect = await receive_as(reader, Connect)
    transport.set_pacing({int(k): v for k, v in connect.pacing.items()})
    await transport.connect(
        {int(k): (o.address, o.port, o.connections) for k, o in connect.outbound.items()},
        {int(k): n for k, n in connect.inbound.items()})
    await send(writer, Ready())
    start = await receive_as(reader, Start)
    runner = StageRunner(config, engines, transport, writer, started_at=start.t0)
    stop = asyncio.Event()
    main_task = asyncio.current_task()
    assert main_task is not None
    controller = asyncio.create_task(control_loop(reader, runner, stop, main_task, links))
    lags: list[float] = []
    watch_lag = asyncio.create_task(lag_monitor(lags))
    try:
        if config.restore_dir:
            for stage in config.stages:
                await restore(runner, stage, stage_file(Path(config.restore_dir),
                                                        config.replica, stage))
        for iteration in range(config.first_iteration, config.iterations):
            started = clock.now()
            try:
                loss = await runner.run_iteration(iteration)
            except Exception as exc:
                await send(writer, WorkerError(f"{type(exc).__name__}: {exc}", iteration,
                                               runner.spans))
                raise
            spans, runner.spans = runner.spans, []
            await send(writer, IterationDone(iteration, started, clock.now(), loss, spans,
                                             percentile(lags, 0.99) or 0.0))
            lags.clear()
            await checkpoint_if_due(runner, iteration + 1)
        await runner.collectives.drain()
        if config.save_dir:
            for stage, engine in engines.items():
                await asyncio.get_running_loop().run_in_executor(
                    runner.executor, save_stage, engine.save, Path(config.save_dir),
                    config.replica, stage)
        synced = await synced_losses(runner)
        await send(writer, Done({str(i): loss for i, loss in synced.items()}))
        await stop.wait()
    finally:
        watch_lag.cancel()
        controller.cancel()
        with contextlib.suppress(BaseException):
            await controller
        await transport.close()
        runner.executor.shutdown(wait=False, cancel_futures=True)
    return 0


async def restore(runner: StageRunner, stage: int, saved: Path) -> None:
    """Load a stage's part of the checkpoint a run resumes from; a damaged or missing
    file is told to the coordinator by name, so the run ends saying which and why."""
    try:
        await asyncio.get_running_loop().run_in_executor(
            runner.executor, runner.engines[stage].restore, str(saved))
    except Exception as exc:
        problem = one_line(f"{type(exc).__name__}: {exc}")[:300]
        await send(runner.control, WorkerError(f"cannot resume from {saved}: {problem}",
                                               runner.config.first_iteration, []))
        raise


async def checkpoint_if_due(runner: StageRunner, done: int) -> None:
    """Write this GPU's part of the checkpoint after `done` iterations (a file for each
    stage it holds), then say so."""
    cfg = runner.config
    if cfg.checkpoint_dir is None or not checkpoint_due(done, cfg.checkpoint_every,
                                                        cfg.iterations, cfg.period):
        return
    directory = iteration_dir(Path(cfg.checkpoint_dir), done)
    for stage, engine in runner.engines.items():
        await asyncio.get_running_loop().run_in_executor(
            runner.executor, save_stage, engine.checkpoint, directory, cfg.replica, stage)
    await send(runner.control, CheckpointWritten(done))


LAG_PERIOD_S = 0.1
"""How often a worker's event loop times its own wake-up. Each look costs this machine
some 60 us of CPU: at 50 a second, 64 idle workers took a fifth of two cores; at 10 a
second a loop held up still shows in an iteration's p99."""


async def lag_monitor(samples: list[float]) -> None:
    """How late this event loop wakes: a late loop starts sends and receives late, which
    the represented network would not."""
    while True:
        before = time.monotonic()
        await asyncio.sleep(LAG_PERIOD_S)
        samples.append(max(0.0, time.monotonic() - before - LAG_PERIOD_S))


def run_loop(coro: Any) -> Any:
    """uvloop where installed: the worker's event loop moves every byte."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="testbed worker (started by the coordinator)")
    parser.add_argument("--control", required=True, help="coordinator's Unix socket")
    parser.add_argument("--gpu", required=True, help="the GPU (host) this worker runs as")
    args = parser.parse_args(argv)
    token = os.environ.pop(TOKEN_ENV, "")
    try:
        code = run_loop(until_signalled(serve(args.control, args.gpu, token)))
    except (asyncio.CancelledError, KeyboardInterrupt):
        code = 1
    except Exception as exc:
        print(f"worker {args.gpu}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        code = 1
    leave(code)


if __name__ == "__main__":
    main()
