"""One worker process per GPU, started inside its host namespace by the coordinator.

It connects to the coordinator over a Unix socket (proving the run's secret), learns its
part of the plan, opens its data connections, runs its action list every iteration, and
reports what it did and when (on the machine-wide monotonic clock).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.plan.model import Action, Op
from testbed.runtime.allreduce import ring_allreduce
from testbed.runtime.checkpoint import checkpoint_due, iteration_dir, save_stage, stage_file
from testbed.runtime.engines import EmulatedEngine, Engine, make_real_engine
from testbed.runtime.health import p99
from testbed.runtime.protocol import read_message, send_message
from testbed.runtime.stopping import until_signalled
from testbed.runtime.transport import Transport

TOKEN_ENV = "TESTBED_RUN_TOKEN"


@dataclass
class Peer:
    index: int
    gpu: str
    dc: str


@dataclass
class WorkerConfig:
    """What the coordinator tells a worker; mirrors the `config` control message."""

    index: int
    gpu: str
    dc: str
    replica: int
    stage: int
    actions: list[Action]
    prev: Peer | None
    next: Peer | None
    ring: list[Peer]
    """This stage's replicas in ring order (this worker included)."""
    arbitrated: set[str]
    """WAN link directions (`src>dst`) whose transfers need a grant."""
    iterations: int
    raw: dict[str, Any]
    first_iteration: int = 0
    """Where a resumed run starts; its state comes from `restore_dir`."""
    restore_dir: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> WorkerConfig:
        def peer(data: dict[str, Any] | None) -> Peer | None:
            return None if data is None else Peer(data["index"], data["gpu"], data["dc"])

        return cls(
            index=msg["index"],
            gpu=msg["gpu"],
            dc=msg["dc"],
            replica=msg["replica"],
            stage=msg["stage"],
            actions=[Action.parse(a) for a in msg["actions"]],
            prev=peer(msg.get("prev")),
            next=peer(msg.get("next")),
            ring=[Peer(p["index"], p["gpu"], p["dc"]) for p in msg["ring"]],
            arbitrated=set(msg.get("arbitrated", [])),
            iterations=msg["iterations"],
            raw=msg,
            first_iteration=int(msg.get("first_iteration", 0)),
            restore_dir=msg.get("restore_dir"),
            checkpoint_dir=msg.get("checkpoint_dir"),
            checkpoint_every=int(msg.get("checkpoint_every", 0)),
        )


@dataclass
class Worker:
    config: WorkerConfig
    engine: Engine
    transport: Transport
    control: asyncio.StreamWriter
    spans: list[dict[str, Any]] = field(default_factory=list)
    grants: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    pending_sends: list[asyncio.Task[None]] = field(default_factory=list)
    bubble_reply: asyncio.Future[dict[str, Any]] | None = None
    decode: asyncio.StreamWriter | None = None
    decode_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    modeled_locks: dict[int, asyncio.Lock] = field(default_factory=dict)
    action: int = 0
    """Position in the action list, so bubbles can be predicted per receive."""
    executor: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(1, "compute")
    )

    def span(self, kind: str, start: float, end: float, iteration: int, **extra: Any) -> None:
        self.spans.append(
            {
                "gpu": self.config.gpu,
                "kind": kind,
                "start": start,
                "end": end,
                "iteration": iteration,
                "stage": self.config.stage,
                **extra,
            }
        )

    async def compute(self, kind: str, iteration: int, fn: Callable[[], Any], **extra: Any) -> Any:
        start = time.monotonic()
        if self.engine.quick():
            result = fn()
            await asyncio.sleep(0)  # let the sends it made ready start, as a GPU stream would
        else:
            result = await asyncio.get_running_loop().run_in_executor(self.executor, fn)
        stretch = float(self.config.raw.get("stretch", 1))
        if stretch > 1:  # real compute under dilation: the GPU stays busy K times as long
            held = (stretch - 1) * (time.monotonic() - start)
            await asyncio.get_running_loop().run_in_executor(self.executor, time.sleep, held)
        self.span(kind, start, time.monotonic(), iteration, **extra)
        return result

    def link_key(self, peer: Peer) -> str | None:
        if peer.dc == self.config.dc:
            return None
        return f"{self.config.dc}>{peer.dc}"

    async def send(
        self,
        peer: Peer,
        tag: str,
        payload: bytes | bytearray | memoryview,
        iteration: int,
        microbatch: int | None,
        kind: str,
    ) -> None:
        """Send, first asking the arbiter for the link when the plan arbitrates it."""
        link = self.link_key(peer)
        queued = time.monotonic()
        pipeline = kind in ("SEND_F", "SEND_B")  # only pipeline traffic is arbitrated
        if link is not None and pipeline and link in self.config.arbitrated:
            grant = asyncio.get_running_loop().create_future()
            self.grants[tag] = grant
            await send_message(
                self.control,
                {
                    "op": "request",
                    "tag": tag,
                    "link": link,
                    "src": self.config.gpu,
                    "dst": peer.gpu,
                    "kind": kind,
                    "replica": self.config.replica,
                    "stage": self.config.stage,
                    "microbatch": microbatch if microbatch is not None else -1,
                    "bytes": len(payload),
                    "iteration": iteration,
                    "ready_at": queued,
                },
            )
            await grant
            self.span(
                "wait_grant",
                queued,
                time.monotonic(),
                iteration,
                microbatch=microbatch,
                link=link,
                peer=peer.gpu,
            )
        start = time.monotonic()
        modeled_bps = self.config.raw.get("intra_dc_bps") if link is None and pipeline else None
        if modeled_bps:
            await self.send_modeled(peer, tag, len(payload), float(modeled_bps))
        else:
            await self.transport.send(peer.index, tag, payload)
        if link is not None and pipeline and link in self.config.arbitrated:
            # the last byte has left: the link is free for the next transfer
            await send_message(self.control, {"op": "sent", "tag": tag})
        self.span(
            "send",
            start,
            time.monotonic(),
            iteration,
            microbatch=microbatch,
            peer=peer.gpu,
            bytes=len(payload),
            link=link,
            tag=tag,
        )

    async def send_modeled(self, peer: Peer, tag: str, nbytes: int, bps: float) -> None:
        """Inside a DC with emulated compute: the bytes take their time at the DC's rate
        (one message at a time per peer, as on its connections), then an empty message
        tells the receiver they are there. Python on a small machine cannot move
        activations at intra-DC rates; the simulator moves them at those rates."""
        async with self.modeled_locks.setdefault(peer.index, asyncio.Lock()):
            await asyncio.sleep(nbytes * 8 / bps)
            await self.transport.send(peer.index, tag, b"")

    def send_later(
        self,
        peer: Peer,
        tag: str,
        payload: bytes,
        iteration: int,
        microbatch: int | None,
        kind: str,
    ) -> None:
        self.pending_sends.append(
            asyncio.create_task(self.send(peer, tag, payload, iteration, microbatch, kind))
        )

    async def receive(
        self, peer: Peer, tag: str, iteration: int, microbatch: int | None
    ) -> bytearray:
        start = time.monotonic()
        action = self.action
        if self.config.raw.get("bubbles") and not self.transport.has(tag):
            await self.fill_bubble(tag, action, iteration, start)
        got = await self.transport.recv(tag)
        now = time.monotonic()
        self.span("recv", start, now, iteration, microbatch=microbatch, peer=peer.gpu,
                  action=action, waited=max(0.0, got.completed_at - start))
        link = self.link_key(peer)
        modeled = link is None and bool(self.config.raw.get("intra_dc_bps"))
        self.span(
            "transfer",
            got.sent_at,
            got.completed_at,
            iteration,
            microbatch=microbatch,
            peer=peer.gpu,
            bytes=int(self.config.raw["activation_bytes"]) if modeled else len(got.data),
            modeled=modeled,
            link=None if link is None else f"{peer.dc}>{self.config.dc}",
            tag=tag,
            src=peer.gpu,
            dst=self.config.gpu,
        )
        return got.data

    async def fill_bubble(self, tag: str, action: int, iteration: int, since: float) -> None:
        """About to wait for `tag`: run the prefills the coordinator admits until the data
        is here or none fits, shipping each KV cache to the decode server."""
        while not self.transport.has(tag):
            self.bubble_reply = asyncio.get_running_loop().create_future()
            await send_message(self.control, {"op": "bubble", "action": action,
                                              "iteration": iteration, "since": since})
            reply = await self.bubble_reply
            if reply.get("op") != "prefill":
                return
            request, length = int(reply["request"]), int(reply["prompt_len"])
            kv = await self.compute(
                "prefill", iteration,
                functools.partial(self.engine.prefill, request, length,
                                  float(reply["modeled_s"]), int(reply["kv_bytes"])),
                request=request, prompt_len=length)
            self.pending_sends.append(asyncio.create_task(self.ship_kv(request, kv, iteration)))

    async def ship_kv(self, request: int, payload: bytes, iteration: int) -> None:
        from testbed.runtime.decode import write_kv

        start = time.monotonic()
        async with self.decode_lock:  # one request's frame at a time on the connection
            if self.decode is None:
                where = self.config.raw["decode"]
                _, self.decode = await asyncio.open_connection(where["address"], where["port"])
            await write_kv(self.decode, request, payload)
        self.span("kv_transfer", start, time.monotonic(), iteration, request=request,
                  bytes=len(payload))

    async def run_iteration(self, iteration: int) -> float | None:
        cfg = self.config
        inputs: dict[int, bytearray] = {}
        grads: dict[int, bytearray] = {}
        outputs: dict[int, bytes | None] = {}
        input_grads: dict[int, bytes | None] = {}
        for index, action in enumerate(cfg.actions):
            self.action = index
            mb = action.microbatch
            op = action.op
            if op is Op.RECV_F:
                assert cfg.prev is not None and mb is not None
                inputs[mb] = await self.receive(
                    cfg.prev, _tag("F", iteration, cfg.replica, cfg.stage, mb), iteration, mb
                )
            elif op is Op.F:
                assert mb is not None
                outputs[mb] = await self.compute(
                    "forward",
                    iteration,
                    functools.partial(self.engine.forward, iteration, mb, inputs.pop(mb, None)),
                    microbatch=mb,
                )
            elif op is Op.SEND_F:
                assert cfg.next is not None and mb is not None
                payload = outputs.pop(mb)
                assert payload is not None
                self.send_later(
                    cfg.next,
                    _tag("F", iteration, cfg.replica, cfg.stage + 1, mb),
                    payload,
                    iteration,
                    mb,
                    "SEND_F",
                )
            elif op is Op.RECV_B:
                assert cfg.next is not None and mb is not None
                grads[mb] = await self.receive(
                    cfg.next, _tag("B", iteration, cfg.replica, cfg.stage, mb), iteration, mb
                )
            elif op is Op.B:
                assert mb is not None
                input_grads[mb] = await self.compute(
                    "backward",
                    iteration,
                    functools.partial(self.engine.backward, iteration, mb, grads.pop(mb, None)),
                    microbatch=mb,
                )
            elif op is Op.SEND_B:
                assert cfg.prev is not None and mb is not None
                payload = input_grads.pop(mb)
                assert payload is not None
                self.send_later(
                    cfg.prev,
                    _tag("B", iteration, cfg.replica, cfg.stage - 1, mb),
                    payload,
                    iteration,
                    mb,
                    "SEND_B",
                )
            elif op is Op.ALLREDUCE:
                await self.allreduce(iteration)
            elif op is Op.STEP:
                await self.compute("step", iteration, self.engine.step)
        await self.flush_sends()
        return self.engine.take_loss()

    async def allreduce(self, iteration: int) -> None:
        cfg = self.config
        start = time.monotonic()
        position = next(i for i, p in enumerate(cfg.ring) if p.index == cfg.index)
        successor = cfg.ring[(position + 1) % len(cfg.ring)]
        modeled = cfg.raw.get("allreduce_modeled_s")
        if modeled is not None:
            # inside one DC, in emulated compute: a real ring over a token-sized buffer keeps
            # the replicas in step as the collective does; the gradients' time is modeled
            token = bytearray(4 * len(cfg.ring))
            await ring_allreduce(self.transport, self.engine, token, position, len(cfg.ring),
                                 successor.index, f"AR{cfg.stage}:{iteration}")
            # the token's own trip is part of the modeled time, not added to it
            left = modeled - (time.monotonic() - start)
            if left > 0:
                await asyncio.get_running_loop().run_in_executor(self.executor, time.sleep, left)
            self.span("allreduce", start, time.monotonic(), iteration,
                      bytes=cfg.raw["grad_bytes"], modeled=True)
            return
        data = await asyncio.get_running_loop().run_in_executor(
            self.executor, self.engine.gradients
        )

        async def send(peer_index: int, tag: str, view: memoryview) -> None:
            await self.send(successor, tag, view, iteration, None, "ALLREDUCE")

        reduced = await ring_allreduce(
            self.transport,
            self.engine,
            data,
            position,
            len(cfg.ring),
            successor.index,
            f"AR{cfg.stage}:{iteration}",
            send,
        )
        await asyncio.get_running_loop().run_in_executor(
            self.executor, lambda: self.engine.apply_reduced(reduced, len(cfg.ring))
        )
        self.span("allreduce", start, time.monotonic(), iteration, bytes=len(data))

    async def flush_sends(self) -> None:
        pending, self.pending_sends = self.pending_sends, []
        if pending:
            await asyncio.gather(*pending)


def _tag(kind: str, iteration: int, replica: int, stage: int, microbatch: int) -> str:
    """Names a message by what it is, for the stage that receives it."""
    return f"{kind}:{iteration}:{replica}:{stage}:{microbatch}"


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
    worker_future: asyncio.Future[Worker],
    stop: asyncio.Event,
    main_task: asyncio.Task[Any],
) -> None:
    """Grants and stop/abort orders from the coordinator, while the worker runs."""
    try:
        while True:
            msg = await read_message(reader)
            if msg["op"] == "grant":
                worker = await worker_future
                future = worker.grants.pop(msg["tag"], None)
                if future is not None and not future.done():
                    future.set_result(None)
            elif msg["op"] in ("prefill", "idle"):
                worker = await worker_future
                if worker.bubble_reply is not None and not worker.bubble_reply.done():
                    worker.bubble_reply.set_result(msg)
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
    worker = Worker(config, engine, transport, writer)
    worker_future: asyncio.Future[Worker] = asyncio.get_running_loop().create_future()
    worker_future.set_result(worker)
    stop = asyncio.Event()
    main_task = asyncio.current_task()
    assert main_task is not None
    controller = asyncio.create_task(control_loop(reader, worker_future, stop, main_task))
    lags: list[float] = []
    watch_lag = asyncio.create_task(lag_monitor(lags))
    try:
        if config.restore_dir:
            saved = stage_file(Path(config.restore_dir), config.replica, config.stage)
            await asyncio.get_running_loop().run_in_executor(worker.executor, engine.restore,
                                                             str(saved))
        for iteration in range(config.first_iteration, config.iterations):
            started = time.monotonic()
            try:
                loss = await worker.run_iteration(iteration)
            except Exception as exc:
                await send_message(
                    writer,
                    {
                        "op": "error",
                        "iteration": iteration,
                        "message": f"{type(exc).__name__}: {exc}",
                        "spans": worker.spans,
                    },
                )
                raise
            spans, worker.spans = worker.spans, []
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
            await checkpoint_if_due(worker, iteration + 1)
        save_dir = raw.get("save_dir")
        if save_dir:
            path = os.path.join(save_dir, f"r{config.replica}-s{config.stage}.pt")
            await asyncio.get_running_loop().run_in_executor(worker.executor, engine.save, path)
        await send_message(writer, {"op": "done"})
        await stop.wait()
    finally:
        watch_lag.cancel()
        controller.cancel()
        with contextlib.suppress(BaseException):
            await controller
        await transport.close()
        worker.executor.shutdown(wait=False, cancel_futures=True)
    return 0


async def checkpoint_if_due(worker: Worker, done: int) -> None:
    """Write this stage's part of the checkpoint after `done` iterations, then say so."""
    cfg = worker.config
    if cfg.checkpoint_dir is None or not checkpoint_due(done, cfg.checkpoint_every,
                                                        cfg.iterations):
        return
    directory = iteration_dir(Path(cfg.checkpoint_dir), done)
    await asyncio.get_running_loop().run_in_executor(
        worker.executor, save_stage, worker.engine.checkpoint, directory, cfg.replica, cfg.stage)
    await send_message(worker.control, {"op": "checkpoint", "done": done})


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
