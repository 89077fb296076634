"""What this machine's CPU pays for the workers' bookkeeping, besides the bytes it
forwards: per span a worker records, and per idle worker.

Every action a worker runs (a send, a receive, a compute handed to its compute thread,
a ring step) is a few Python callbacks, a task or two, a span, and that span's trip to
the coordinator in an `IterationDone`, whatever the bytes. Measured once by running the
real thing small: a 1F1B pipeline of stage runners (2 replicas x 3 stages, emulated
compute held 0.5 ms per step so every compute goes through the compute thread, 16 KiB
messages over loopback TCP, a ring all-reduce per iteration) in this process, each
iteration's spans sent over a Unix socket with the control protocol and read back as
the coordinator reads them. CPU seconds of this process (every thread) over spans
recorded; and an idle event loop's CPU per second with the workers' lag monitor.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import time

from testbed.emulator.runtime.wire.messages import (
    CollectiveSetup,
    Config,
    EmulatedTiming,
    IterationDone,
    PeerInfo,
    receive_as,
    send,
)
from testbed.emulator.runtime.worker.compute.engines import make_engines
from testbed.emulator.runtime.worker.process import lag_monitor, make_transport, run_loop
from testbed.emulator.runtime.worker.stage_runner import StageRunner
from testbed.job.model import ModelShape
from testbed.plan.schedules import stage_actions
from testbed.run.dilation import WorkerCosts

TOKEN = b"testbed-calibration".ljust(32, b"\0")
REPLICAS, STAGES, MICROBATCHES, ITERATIONS = 2, 3, 16, 4
MESSAGE = 16 * 1024
COMPUTE_S = 0.0005
IDLE_S = 0.5


def measure_worker_costs(repeat: int = 3) -> WorkerCosts:
    """On the workers' event loop (uvloop where installed); the median of `repeat`
    measurements each (a shared machine's other work makes single ones vary)."""
    spans = [run_loop(_span_cost()) for _ in range(repeat)]
    idle = [run_loop(_idle_cost()) for _ in range(repeat)]
    return WorkerCosts(statistics.median(spans), statistics.median(idle))


def _config(replica: int, stage: int) -> Config:
    def peer(r: int, s: int) -> PeerInfo:
        return PeerInfo(r * STAGES + s, f"c{s}-{r}", f"c{s}")

    me = peer(replica, stage)
    actions = stage_actions("1f1b", stage, STAGES, MICROBATCHES, REPLICAS)
    return Config(
        index=me.index, gpu=me.gpu, dc=me.dc, address="127.0.0.1", replica=replica,
        stages=[stage], programs=[[str(a) for a in actions]], cycle=[],
        neighbours={str(s): peer(replica, s) for s in (stage - 1, stage + 1)
                    if 0 <= s < STAGES},
        collectives=[CollectiveSetup(stage, "", MESSAGE,
                                     [peer(r, stage) for r in range(REPLICAS)])],
        arbitrated=[], iterations=ITERATIONS, compute="emulated",
        model=ModelShape(STAGES, 8, 1, 4, 16), layers=[1] * STAGES, seed=0, dp=REPLICAS,
        microbatches=MICROBATCHES, microbatch_size=1, activation_bytes=MESSAGE,
        emulated={str(stage): EmulatedTiming(COMPUTE_S, COMPUTE_S, COMPUTE_S / 2,
                                             COMPUTE_S / 2, COMPUTE_S)}, local_rank=0)


async def _span_cost() -> float:
    configs = [_config(r, s) for r in range(REPLICAS) for s in range(STAGES)]
    transports = [make_transport(c, TOKEN) for c in configs]
    ports = [await t.listen("127.0.0.1", 0) for t in transports]
    await asyncio.gather(*(
        t.connect({j: ("127.0.0.1", ports[j], 1) for j in range(i + 1, len(configs))},
                  dict.fromkeys(range(i), 1))
        for i, t in enumerate(transports)))
    worker_end, coordinator_end = socket.socketpair()
    _, writer = await asyncio.open_unix_connection(sock=worker_end)
    coordinator, coordinator_writer = await asyncio.open_unix_connection(sock=coordinator_end)
    runners = [StageRunner(c, make_engines(c), t, writer) for c, t in zip(configs, transports,
                                                                         strict=True)]
    spans = 0
    try:
        await _iteration(runners, 0, writer, coordinator)  # connections warm up
        started = time.process_time()
        for iteration in range(1, ITERATIONS):
            spans += await _iteration(runners, iteration, writer, coordinator)
        used = time.process_time() - started
    finally:
        for t in transports:
            await t.close()
        for runner in runners:
            runner.executor.shutdown(wait=False)
        writer.close()
        coordinator_writer.close()
    return used / spans


async def _iteration(runners: list[StageRunner], iteration: int,
                     writer: asyncio.StreamWriter, coordinator: asyncio.StreamReader) -> int:
    """One iteration of every runner; its spans through the control protocol."""
    await asyncio.gather(*(r.run_iteration(iteration) for r in runners))
    spans = 0
    for runner in runners:
        done, runner.spans = runner.spans, []
        await send(writer, IterationDone(iteration, 0.0, 0.0, None, done, 0.0))
        spans += len((await receive_as(coordinator, IterationDone)).spans)
    return spans


async def _idle_cost() -> float:
    lags: list[float] = []
    monitor = asyncio.create_task(lag_monitor(lags))
    started, wall = time.process_time(), time.monotonic()
    await asyncio.sleep(IDLE_S)
    used = time.process_time() - started
    monitor.cancel()
    return used / (time.monotonic() - wall)
