"""One worker process per GPU, started inside its host namespace by the coordinator.

It connects to the coordinator over a Unix socket (proving the run's secret), learns its
part of the plan, opens its data connections, has its stage runner (testbed.runtime.
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

from testbed.runtime.checkpoint import checkpoint_due, iteration_dir, save_stage, stage_file
from testbed.runtime.engines import EmulatedEngine, Engine, make_real_engine
from testbed.runtime.health import p99
from testbed.runtime.protocol import TOKEN_ENV, read_message, send_message
from testbed.runtime.stage_runner import StageRunner
from testbed.runtime.stopping import until_signalled
from testbed.runtime.transport import Transport
from testbed.runtime.worker_config import WorkerConfig


def make_engine(raw: dict[str, Any]) -> Engine:
    if raw["compute"] == "real":
        return make_real_engine(raw)
    timing = raw["emulated"]
    return EmulatedEngine(
        timing["forward_s"],
        timing["backward_s"],
        timing["step_s"],
        raw["activation_bytes"],
        raw["grad_bytes"],
        raw["stage"] == 0,
        raw["stage"] == len(raw["layers"]) - 1,
    )


async def control_loop(
    reader: asyncio.StreamReader,
    runner_future: asyncio.Future[StageRunner],
    stop: asyncio.Event,
    main_task: asyncio.Task[Any],
) -> None:
    """Grants and stop/abort orders from the coordinator, while the worker runs."""
    try:
        while True:
            msg = await read_message(reader)
            if msg["op"] == "grant":
                runner = await runner_future
                future = runner.grants.pop(msg["tag"], None)
                if future is not None and not future.done():
                    future.set_result(None)
            elif msg["op"] in ("prefill", "idle"):
                runner = await runner_future
                if runner.bubble_reply is not None and not runner.bubble_reply.done():
                    runner.bubble_reply.set_result(msg)
            elif msg["op"] == "stop":
                stop.set()
            elif msg["op"] == "abort":
                main_task.cancel()
                return
    except (asyncio.IncompleteReadError, ConnectionError):
        main_task.cancel()  # the coordinator is gone: so are we


async def serve(control_path: str, gpu: str, token: str) -> int:
    reader, writer = await asyncio.open_unix_connection(control_path)
    await send_message(writer, {"op": "hello", "gpu": gpu, "token": token, "pid": os.getpid()})
    msg = await read_message(reader)
    if msg.get("op") != "config":
        return 2
    config = WorkerConfig.from_message(msg)
    raw = msg
    transport = Transport(config.index, bytes.fromhex(token))
    port = await transport.listen(raw["address"], 0)
    engine = await asyncio.get_running_loop().run_in_executor(None, make_engine, raw)
    await send_message(writer, {"op": "listening", "port": port})
    msg = await read_message(reader)  # where to connect
    outbound = {
        int(k): (v["address"], v["port"], v["connections"]) for k, v in msg["outbound"].items()
    }
    inbound = {int(k): n for k, n in msg["inbound"].items()}
    transport.set_pacing({int(k): float(v) for k, v in msg.get("pacing", {}).items()})
    await transport.connect(outbound, inbound)
    await send_message(writer, {"op": "ready"})
    msg = await read_message(reader)
    if msg.get("op") != "start":
        return 2
    runner = StageRunner(config, engine, transport, writer)
    runner_future: asyncio.Future[StageRunner] = asyncio.get_running_loop().create_future()
    runner_future.set_result(runner)
    stop = asyncio.Event()
    main_task = asyncio.current_task()
    assert main_task is not None
    controller = asyncio.create_task(control_loop(reader, runner_future, stop, main_task))
    lags: list[float] = []
    watch_lag = asyncio.create_task(lag_monitor(lags))
    try:
        if config.restore_dir:
            saved = stage_file(Path(config.restore_dir), config.replica, config.stage)
            await asyncio.get_running_loop().run_in_executor(runner.executor, engine.restore,
                                                             str(saved))
        for iteration in range(config.first_iteration, config.iterations):
            started = time.monotonic()
            try:
                loss = await runner.run_iteration(iteration)
            except Exception as exc:
                await send_message(
                    writer,
                    {
                        "op": "error",
                        "iteration": iteration,
                        "message": f"{type(exc).__name__}: {exc}",
                        "spans": runner.spans,
                    },
                )
                raise
            spans, runner.spans = runner.spans, []
            await send_message(
                writer,
                {
                    "op": "iteration",
                    "iteration": iteration,
                    "started": started,
                    "ended": time.monotonic(),
                    "loss": loss,
                    "spans": spans,
                    "lag_p99_s": p99(lags),
                },
            )
            lags.clear()
            await checkpoint_if_due(runner, iteration + 1)
        save_dir = raw.get("save_dir")
        if save_dir:
            path = os.path.join(save_dir, f"r{config.replica}-s{config.stage}.pt")
            await asyncio.get_running_loop().run_in_executor(runner.executor, engine.save, path)
        await send_message(writer, {"op": "done"})
        await stop.wait()
    finally:
        watch_lag.cancel()
        controller.cancel()
        with contextlib.suppress(BaseException):
            await controller
        await transport.close()
        runner.executor.shutdown(wait=False, cancel_futures=True)
    return 0


async def checkpoint_if_due(runner: StageRunner, done: int) -> None:
    """Write this stage's part of the checkpoint after `done` iterations, then say so."""
    cfg = runner.config
    if cfg.checkpoint_dir is None or not checkpoint_due(done, cfg.checkpoint_every,
                                                        cfg.iterations):
        return
    directory = iteration_dir(Path(cfg.checkpoint_dir), done)
    await asyncio.get_running_loop().run_in_executor(
        runner.executor, save_stage, runner.engine.checkpoint, directory, cfg.replica, cfg.stage)
    await send_message(runner.control, {"op": "checkpoint", "done": done})


LAG_PERIOD_S = 0.02


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
    sys.exit(code)


if __name__ == "__main__":
    main()
