"""A worker's data plane: each iteration it runs its interpreted steps (testbed.plan.
interpret) on its engines (one for each stage its GPU holds) and transport, asks the
coordinator for a grant before each transfer on an arbitrated link, fills bubbles with the
prefills the coordinator admits, and records what it did and when as spans (on the
machine-wide monotonic clock), each naming its stage.

A message between two stages of this GPU is handed over in memory: no socket, no bytes on
a network; its receive and the wait for its send are recorded (taking no time), as the
simulator records them."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Unpack

from testbed.common.spans import Span, SpanDetail, SpanKind
from testbed.emulator.runtime.wire.arbitration import Sent, TransferRequest
from testbed.emulator.runtime.wire.messages import BubbleAsk, Config, Idle, PeerInfo
from testbed.emulator.runtime.wire.messages import Prefill as PrefillOrder
from testbed.emulator.runtime.wire.messages import send as send_message
from testbed.emulator.runtime.worker.collectives.allreduce import Received, Wire
from testbed.emulator.runtime.worker.collectives.in_backward import InBackward
from testbed.emulator.runtime.worker.compute.engines import Engine
from testbed.emulator.runtime.worker.stage_collectives import Collectives
from testbed.emulator.runtime.worker.transport import clock
from testbed.emulator.runtime.worker.transport.transport import Transport
from testbed.plan.interpret import (
    AllReduce,
    Compute,
    OptimizerStep,
    OuterStep,
    Overlapped,
    Part,
    Phase,
    Prefill,
    Receive,
    ReduceStart,
    ReduceWait,
    Send,
    SendWait,
    Step,
    interpret,
)
from testbed.plan.model import Action, Op
from testbed.scenario.slowdowns import factor_at

Tensors = dict[tuple[Phase, int, int], Any]
"""An iteration's tensors by (phase, stage, microbatch): received for a stage's compute,
or computed by it for its send."""


@dataclass
class StageRunner:
    config: Config
    engines: Mapping[int, Engine]
    """By stage, each stage the GPU holds."""
    transport: Transport
    control: asyncio.StreamWriter
    spans: list[Span] = field(default_factory=list)
    grants: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    """Arbitrated transfers waiting for the coordinator's grant, by message tag."""
    pending_sends: list[asyncio.Task[None]] = field(default_factory=list)
    sending: dict[tuple[Phase, int, int], asyncio.Task[None]] = field(default_factory=dict)
    """Pipeline sends a later step waits for, by (phase, receiving stage, microbatch)."""
    handed: dict[str, Wire] = field(default_factory=dict)
    """Messages between two stages of this GPU, by tag, until their receive."""
    bubble_reply: asyncio.Future[PrefillOrder | Idle] | None = None
    decode: asyncio.StreamWriter | None = None
    decode_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    modeled_locks: dict[int, asyncio.Lock] = field(default_factory=dict)
    action: int = 0
    """Position in the action list, so bubbles can be predicted per receive."""
    executor: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(1, "compute")
    )
    started_at: float = 0.0
    """When training started (the coordinator's clock): stragglers' windows count
    from it."""
    programs: list[tuple[Step, ...]] = field(init=False)
    """Each iteration program's steps (Config.programs)."""
    collectives: Collectives = field(init=False)
    quick: bool = field(init=False)
    """Every engine's calls are too short to hand to the compute thread."""

    def __post_init__(self) -> None:
        cfg = self.config
        self.programs = [interpret([Action.parse(a) for a in actions], cfg.stages, cfg.pp)
                         for actions in cfg.programs]
        self.collectives = Collectives(self)
        self.quick = all(engine.quick() for engine in self.engines.values())

    @property
    def engine(self) -> Engine:
        """The engine of its first stage: what runs prefills and reports the loss where
        one stage must."""
        return self.engines[self.config.stage]

    def span(self, kind: SpanKind, start: float, end: float, iteration: int,
             **detail: Unpack[SpanDetail]) -> None:
        """A span of the stage `detail` names (by default its first)."""
        self.spans.append({"gpu": self.config.gpu, "kind": kind, "start": start, "end": end,
                           "iteration": iteration, "stage": self.config.stage, **detail})

    async def run_iteration(self, iteration: int) -> float | None:
        """Every step of the iteration's program in order; sends go on in the background
        and all have left when this returns (an all-reduce started may go on). The loss,
        on the last stage with real compute."""
        received: Tensors = {}
        computed: Tensors = {}
        steps = self.programs[self.config.program_of(iteration)]
        for index in range(len(steps)):
            self.action = index
            await self.run_step(steps, index, iteration, received, computed)
        await self.flush_sends()
        for engine in self.engines.values():
            engine.iteration_done(iteration)
        losses = [loss for engine in self.engines.values()
                  if (loss := engine.take_loss()) is not None]
        return losses[0] if losses else None

    async def run_step(self, steps: tuple[Step, ...], index: int, iteration: int,
                       received: Tensors, computed: Tensors) -> None:
        """Step `index` of the iteration's program, to its end but for a send, which goes
        on in the background."""
        step = steps[index]
        match step:
            case Receive(phase=phase, stage=stage, microbatch=mb):
                received[(phase, stage, mb)] = await self.receive_step(step, iteration)
            case Compute():
                await self.run_compute(step, iteration, received, computed,
                                       self.collectives.in_backward(steps, index, iteration))
            case Overlapped(parts=parts):  # one after the other, as torch's runtime
                starts = self.collectives.in_backward(steps, index, iteration)
                for part in parts:
                    await self.run_compute(part, iteration, received, computed, starts)
            case Send():
                self.send_step(step, iteration, computed)
            case SendWait():
                await self.wait_send(step, iteration)
            case AllReduce(collective=collective, stage=stage):
                await self.collectives.allreduce(collective, stage, iteration)
            case ReduceStart(collective=collective, stage=stage):
                await self.collectives.start(collective, stage, iteration)
            case ReduceWait(collective=collective, stage=stage):
                await self.collectives.wait(collective, stage, iteration)
            case OptimizerStep(stage=stage):
                await self.compute("step", iteration, self.engines[stage].step,
                                   stage=stage)
            case OuterStep(collective=collective, stage=stage):
                await self.compute("outer_step", iteration, functools.partial(
                    self.engines[stage].outer_step, collective),
                    collective=str(collective), stage=stage)
            case Prefill():
                pass  # nothing runs there (see testbed.plan.interpret)

    def send_step(self, step: Send, iteration: int, computed: Tensors) -> None:
        """The tensor a send names, handed over in memory to another stage of this GPU,
        or sent in the background for a later step to wait for."""
        mb = step.microbatch
        payload = computed.pop((step.phase, step.stage, mb))
        assert payload is not None
        tag = str(step.tag(iteration, self.config.replica))
        if step.local:
            self.handed[tag] = payload
        else:
            self.sending[(step.phase, step.to_stage, mb)] = self.send_later(
                self.neighbour(step.to_stage), tag, payload, iteration, mb, step.op,
                step.stage)

    async def run_compute(self, step: Compute, iteration: int, received: Tensors,
                          computed: Tensors, starts: list[tuple[int, InBackward]]) -> None:
        """A forward, backward, or half of a split one, on its stage's engine; a span
        naming its stage and, for a half, its part. `starts`: the all-reduces that start
        in the backward of their stage (testbed.plan.interpret.ReduceStart)."""
        engine, mb = self.engines[step.stage], step.microbatch
        key = (step.phase, step.stage, mb)
        mine = [start for stage, start in starts if stage == step.stage]
        run: Callable[[], Wire | None]
        if step.phase is Phase.FORWARD:
            run = functools.partial(engine.forward, iteration, mb, received.pop(key, None))
        elif step.part is Part.WEIGHT:
            run = functools.partial(engine.weight_gradient, iteration, mb, mine)
        elif step.part is Part.INPUT:
            run = functools.partial(engine.input_gradient, iteration, mb,
                                    received.pop(key, None))
        else:
            run = functools.partial(engine.backward, iteration, mb, received.pop(key, None),
                                    mine)
        detail: SpanDetail = {"microbatch": mb, "stage": step.stage}
        if step.part is not Part.WHOLE:
            detail["part"] = "I" if step.part is Part.INPUT else "W"
        result = await self.compute(step.phase.label, iteration, run, **detail)
        if step.part is not Part.WEIGHT:
            computed[key] = result

    async def receive_step(self, step: Receive, iteration: int) -> Received:
        """The tensor a receive waits for: off the network, or handed over on this GPU."""
        tag = str(step.tag(iteration, self.config.replica))
        if not step.local:
            return await self.receive(self.neighbour(step.from_stage), tag, iteration,
                                      step.microbatch, step.stage)
        now = clock.now()
        self.span("recv", now, now, iteration, microbatch=step.microbatch,
                  peer=self.config.gpu, action=self.action, waited=0.0, stage=step.stage)
        return self.handed.pop(tag)

    def neighbour(self, stage: int) -> PeerInfo:
        """The worker that holds `stage` in this replica's pipeline, next to one of this
        GPU's stages."""
        peer = self.config.neighbours.get(str(stage))
        if peer is None:
            raise RuntimeError(f"{self.config.gpu} has no neighbour holding stage {stage}")
        return peer

    async def compute(self, kind: SpanKind, iteration: int, fn: Callable[[], Any],
                      **detail: Unpack[SpanDetail]) -> Any:
        start = clock.now()
        if self.quick:
            result = fn()
            await asyncio.sleep(0)  # let the sends it made ready start, as a GPU stream would
        else:
            result = await asyncio.get_running_loop().run_in_executor(self.executor, fn)
        stretch = float(self.config.stretch)  # real compute under dilation: K times
        if kind in ("forward", "backward"):  # a straggler's: `slower` times as long
            stretch *= factor_at(self.config.slowdowns, start - self.started_at)
        if stretch > 1:  # the GPU stays busy that many times as long as it took
            held = (stretch - 1) * (clock.now() - start)
            await asyncio.get_running_loop().run_in_executor(self.executor, time.sleep, held)
        self.span(kind, start, clock.now(), iteration, **detail)
        return result

    def link_key(self, peer: PeerInfo) -> str | None:
        if peer.dc == self.config.dc:
            return None
        return f"{self.config.dc}>{peer.dc}"

    async def send(
        self,
        peer: PeerInfo,
        tag: str,
        payload: Wire,
        iteration: int,
        microbatch: int | None,
        kind: Op,
        stage: int,
        collective: str = "",
    ) -> None:
        """Send, first asking the arbiter for the link when the plan arbitrates it.
        `kind`: SEND_F or SEND_B for pipeline messages, ALLREDUCE for a ring's chunks
        (of `collective`); `stage`: the sending one."""
        link = self.link_key(peer)
        queued = clock.now()
        pipeline = kind.is_send
        granted = link is not None and (link in self.config.arbitrated if pipeline
                                        else self.config.arbitrated_syncs)
        if granted and link is not None:
            grant = asyncio.get_running_loop().create_future()
            self.grants[tag] = grant
            await send_message(self.control, TransferRequest(
                tag=tag, link=link, src=self.config.gpu, dst=peer.gpu, kind=kind.value,
                replica=self.config.replica, stage=stage,
                microbatch=microbatch if microbatch is not None else -1,
                nbytes=len(payload), iteration=iteration, ready_at=queued,
                collective=collective))
            await grant
            self.span(
                "wait_grant",
                queued,
                clock.now(),
                iteration,
                microbatch=microbatch,
                link=link,
                peer=peer.gpu,
                stage=stage,
            )
        start = clock.now()
        modeled_bps = self.config.intra_dc_bps if link is None and pipeline else None
        if modeled_bps:
            await self.send_modeled(peer, tag, len(payload), modeled_bps)
        else:
            await self.transport.send(peer.index, tag, payload)
        left = clock.now()  # before the link is released: the next send starts after it
        if granted:  # the last byte has left: the link is free for the next transfer
            await send_message(self.control, Sent(tag))
        self.span(
            "send",
            start,
            left,
            iteration,
            microbatch=microbatch,
            peer=peer.gpu,
            bytes=len(payload),
            link=link,
            tag=tag,
            stage=stage,
        )

    async def send_modeled(self, peer: PeerInfo, tag: str, nbytes: int, bps: float) -> None:
        """Inside a DC with emulated compute: the bytes take their time at the DC's rate
        (one message at a time per peer, as on its connections), then an empty message
        tells the receiver they are there. Python on a small machine cannot move
        activations at intra-DC rates; the simulator moves them at those rates."""
        async with self.modeled_locks.setdefault(peer.index, asyncio.Lock()):
            await asyncio.sleep(nbytes * 8 / bps)
            await self.transport.send(peer.index, tag, b"")

    def send_later(
        self,
        peer: PeerInfo,
        tag: str,
        payload: Wire,
        iteration: int,
        microbatch: int | None,
        kind: Op,
        stage: int,
    ) -> asyncio.Task[None]:
        task = asyncio.create_task(self.send(peer, tag, payload, iteration, microbatch, kind,
                                             stage))
        self.pending_sends.append(task)
        return task

    async def wait_send(self, step: SendWait, iteration: int) -> None:
        """Until the send has left and the receiving host has acknowledged its last byte
        (at once for one handed over on this GPU)."""
        start = clock.now()
        if step.local:
            self.span("wait_send", start, start, iteration, microbatch=step.microbatch,
                      peer=self.config.gpu, stage=step.stage)
            return
        peer = self.neighbour(step.to_stage)
        await self.sending.pop((step.phase, step.to_stage, step.microbatch))
        await self.transport.acknowledged(peer.index)
        self.span("wait_send", start, clock.now(), iteration, microbatch=step.microbatch,
                  peer=peer.gpu, stage=step.stage)

    async def receive(
        self, peer: PeerInfo, tag: str, iteration: int, microbatch: int | None, stage: int
    ) -> bytearray | None:
        """A pipeline message for `stage` (this GPU's) from the network: its payload (None
        where the transport keeps only sizes)."""
        start = clock.now()
        action = self.action
        if self.config.bubbles and not self.transport.has(tag):
            await self.fill_bubble(lambda: not self.transport.has(tag), action, iteration,
                                   start)
        got = await self.transport.recv(tag)
        now = clock.now()
        self.span("recv", start, now, iteration, microbatch=microbatch, peer=peer.gpu,
                  action=action, waited=max(0.0, got.completed_at - start), stage=stage)
        link = self.link_key(peer)
        modeled = link is None and bool(self.config.intra_dc_bps)
        self.span(
            "transfer",
            got.sent_at,
            got.completed_at,
            iteration,
            microbatch=microbatch,
            peer=peer.gpu,
            bytes=self.config.activation_bytes if modeled else got.nbytes,
            modeled=modeled,
            link=None if link is None else f"{peer.dc}>{self.config.dc}",
            tag=tag,
            src=peer.gpu,
            dst=self.config.gpu,
            stage=stage,
        )
        return got.data

    async def fill_bubble(self, waiting: Callable[[], bool], action: int, iteration: int,
                          since: float) -> None:
        """About to wait (at a receive, an all-reduce): run the prefill passes the
        coordinator admits while `waiting()` or until none fits, shipping each finished
        request's KV cache to the decode server."""
        while waiting():
            self.bubble_reply = asyncio.get_running_loop().create_future()
            await send_message(self.control, BubbleAsk(action, iteration, since))
            reply = await self.bubble_reply
            if not isinstance(reply, PrefillOrder):
                return
            payloads = await self.compute(
                "prefill", iteration,
                functools.partial(self.engine.prefill, reply.parts, reply.modeled_s),
                requests=[p.request for p in reply.parts],
                tokens=sum(p.end - p.start for p in reply.parts))
            for request, kv in payloads.items():
                self.pending_sends.append(asyncio.create_task(self.ship_kv(request, kv,
                                                                           iteration)))

    async def ship_kv(self, request: int, payload: bytes, iteration: int) -> None:
        from testbed.emulator.runtime.worker.decode import write_kv

        start = clock.now()
        async with self.decode_lock:  # one request's frame at a time on the connection
            if self.decode is None:
                where = self.config.decode
                if where is None:
                    raise RuntimeError("a prefill ran but the run has no decode server")
                _, self.decode = await asyncio.open_connection(where.address, where.port)
            await write_kv(self.decode, request, payload)
        self.span("kv_transfer", start, clock.now(), iteration, request=request,
                  bytes=len(payload))

    async def flush_sends(self) -> None:
        pending, self.pending_sends = self.pending_sends, []
        if pending:
            await asyncio.gather(*pending)
