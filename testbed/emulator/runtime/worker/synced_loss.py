"""The loss of the model a DiLoCo-family run would keep: the synchronized (outer)
parameters, as every fragment's last sync left them, rather than the replicas' local ones
that step between syncs.

Replica 0 keeps its stages' outer parameters as the run starts and after each cycle's
last iteration (RealEngine.keep_synced: every fragment has synced by then; all replicas
hold the same outer parameters), a host copy of its stages' parameters a cycle. After
training, outside the run's measured time, replica 0's pipeline evaluates each kept model
on the global batch of the iteration it is kept for (every replica's microbatches; the
one after the run's last for the model it ends with), stage by stage over the pipeline's
own connections: the loss that iteration's training step would report had its replicas
held the synchronized model (for plain DiLoCo, whose outer step replaces the local
parameters, it is exactly the loss they report).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Mapping
from typing import Protocol

from testbed.emulator.runtime.wire.messages import Config, PeerInfo
from testbed.emulator.runtime.worker.collectives.allreduce import Received, Wire
from testbed.emulator.runtime.worker.compute.engines import Engine
from testbed.emulator.runtime.worker.transport.transport import Transport


class Runner(Protocol):
    """What of the stage runner the evaluation uses."""

    config: Config
    engines: Mapping[int, Engine]
    transport: Transport
    executor: concurrent.futures.ThreadPoolExecutor

    def neighbour(self, stage: int) -> PeerInfo: ...


async def synced_losses(runner: Runner) -> dict[int, float]:
    """By iteration, the synchronized model's mean loss over that iteration's global
    batch, on the worker of replica 0 that holds the last stage; empty elsewhere."""
    cfg = runner.config
    kept = runner.engines[cfg.stage].synced_at()
    if cfg.replica != 0 or not kept:
        return {}
    loop = asyncio.get_running_loop()
    slots = [(r, mb) for r in range(cfg.dp) for mb in range(cfg.microbatches)]
    handed: dict[str, Wire] = {}
    losses: dict[int, list[float]] = {}
    for stage in sorted(cfg.stages):  # the stages before this one's are done or on their way
        engine = runner.engines[stage]
        for iteration in kept:
            for replica, microbatch in slots:
                received: Received = None
                if stage > 0:
                    tag = _tag(stage, iteration, replica, microbatch)
                    received = handed.pop(tag) if stage - 1 in cfg.stages else \
                        (await runner.transport.recv(tag)).data
                out = await loop.run_in_executor(runner.executor, engine.evaluate,
                                                 iteration, replica, microbatch, received)
                if isinstance(out, float):
                    losses.setdefault(iteration, []).append(out)
                    continue
                tag = _tag(stage + 1, iteration, replica, microbatch)
                if stage + 1 in cfg.stages:
                    handed[tag] = out
                else:
                    await runner.transport.send(runner.neighbour(stage + 1).index, tag, out)
    return {i: sum(values) / len(values) for i, values in losses.items()}


def _tag(stage: int, iteration: int, replica: int, microbatch: int) -> str:
    """The message carrying stage `stage`'s input."""
    return f"SYNCED{stage}:{iteration}:{replica}:{microbatch}"
