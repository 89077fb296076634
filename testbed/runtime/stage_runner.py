"""A worker's data plane: each iteration it runs its interpreted steps (testbed.plan.
interpret) on its engine and transport, asks the coordinator for a grant before each
transfer on an arbitrated link, fills bubbles with the prefills the coordinator admits,
and records what it did and when as spans (on the machine-wide monotonic clock)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Unpack

from testbed.plan.interpret import (
    AllReduce,
    Compute,
    OptimizerStep,
    OuterStep,
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
from testbed.runtime import clock
from testbed.runtime.collectives import Collectives
from testbed.runtime.engines import Engine
from testbed.runtime.messages import BubbleAsk, Config, Idle, PeerInfo, Sent, TransferRequest
from testbed.runtime.messages import Prefill as PrefillOrder
from testbed.runtime.messages import send as send_message
from testbed.runtime.transport import Transport
from testbed.spans import Span, SpanDetail, SpanKind


@dataclass
class StageRunner:
    config: Config
    engine: Engine
    transport: Transport
    control: asyncio.StreamWriter
    spans: list[Span] = field(default_factory=list)
    grants: dict[str, asyncio.Future[None]] = field(default_factory=dict)
    """Arbitrated transfers waiting for the coordinator's grant, by message tag."""
    pending_sends: list[asyncio.Task[None]] = field(default_factory=list)
    sending: dict[tuple[Phase, int], asyncio.Task[None]] = field(default_factory=dict)
    """Pipeline sends a later step waits for."""
    bubble_reply: asyncio.Future[PrefillOrder | Idle] | None = None
    decode: asyncio.StreamWriter | None = None
    decode_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    modeled_locks: dict[int, asyncio.Lock] = field(default_factory=dict)
    action: int = 0
    """Position in the action list, so bubbles can be predicted per receive."""
    executor: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(1, "compute")
    )
    programs: list[tuple[Step, ...]] = field(init=False)
    """Each iteration program's steps (Config.programs)."""
    collectives: Collectives = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.config
        self.programs = [interpret([Action.parse(a) for a in actions], cfg.stage, cfg.pp)
                         for actions in cfg.programs]
        self.collectives = Collectives(self)

    def span(self, kind: SpanKind, start: float, end: float, iteration: int,
             **detail: Unpack[SpanDetail]) -> None:
        self.spans.append({"gpu": self.config.gpu, "kind": kind, "start": start, "end": end,
                           "iteration": iteration, "stage": self.config.stage, **detail})

    async def run_iteration(self, iteration: int) -> float | None:
        """Every step of the iteration's program in order; sends go on in the background
        and all have left when this returns (an all-reduce started may go on). The loss,
        on the last stage with real compute."""
        received: dict[Phase, dict[int, bytearray]] = {Phase.FORWARD: {}, Phase.BACKWARD: {}}
        computed: dict[Phase, dict[int, bytes | None]] = {Phase.FORWARD: {}, Phase.BACKWARD: {}}
        steps = self.programs[self.config.program_of(iteration)]
        for index, step in enumerate(steps):
            self.action = index
            match step:
                case Receive(phase=phase, from_stage=stage, microbatch=mb):
                    tag = str(step.tag(iteration, self.config.replica))
                    received[phase][mb] = await self.receive(self.neighbour(stage), tag,
                                                             iteration, mb)
                case Compute(phase=phase, microbatch=mb):
                    run = self.engine.forward if phase is Phase.FORWARD else self.engine.backward
                    computed[phase][mb] = await self.compute(
                        phase.label,
                        iteration,
                        functools.partial(run, iteration, mb, received[phase].pop(mb, None)),
                        microbatch=mb,
                    )
                case Send(phase=phase, to_stage=stage, microbatch=mb):
                    payload = computed[phase].pop(mb)
                    assert payload is not None
                    tag = str(step.tag(iteration, self.config.replica))
                    self.sending[(phase, mb)] = self.send_later(
                        self.neighbour(stage), tag, payload, iteration, mb, step.op)
                case SendWait():
                    await self.wait_send(step, iteration)
                case AllReduce(collective=collective):
                    await self.collectives.allreduce(collective, iteration)
                case ReduceStart(collective=collective):
                    await self.collectives.start(collective, iteration)
                case ReduceWait(collective=collective):
                    await self.collectives.wait(collective, iteration)
                case OptimizerStep():
                    await self.compute("step", iteration, self.engine.step)
                case OuterStep(collective=collective):
                    await self.compute("outer_step", iteration, functools.partial(
                        self.engine.outer_step, collective), collective=str(collective))
                case Prefill():
                    pass  # nothing runs there (see testbed.plan.interpret)
        await self.flush_sends()
        return self.engine.take_loss()

    def neighbour(self, stage: int) -> PeerInfo:
        """The worker that runs `stage` in this replica's pipeline, next to this one."""
        cfg = self.config
        peer = cfg.next if stage == cfg.stage + 1 else cfg.prev if stage == cfg.stage - 1 else None
        if peer is None:
            raise RuntimeError(f"stage {cfg.stage} has no neighbour running stage {stage}")
        return peer

    async def compute(self, kind: SpanKind, iteration: int, fn: Callable[[], Any],
                      **detail: Unpack[SpanDetail]) -> Any:
        start = clock.now()
        if self.engine.quick():
            result = fn()
            await asyncio.sleep(0)  # let the sends it made ready start, as a GPU stream would
        else:
            result = await asyncio.get_running_loop().run_in_executor(self.executor, fn)
        stretch = self.config.stretch
        if stretch > 1:  # real compute under dilation: the GPU stays busy K times as long
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
        payload: bytes | bytearray | memoryview,
        iteration: int,
        microbatch: int | None,
        kind: Op,
    ) -> None:
        """Send, first asking the arbiter for the link when the plan arbitrates it.
        `kind`: SEND_F or SEND_B for pipeline messages, ALLREDUCE for a ring's chunks."""
        link = self.link_key(peer)
        queued = clock.now()
        pipeline = kind.is_send  # only pipeline traffic is arbitrated
        if link is not None and pipeline and link in self.config.arbitrated:
            grant = asyncio.get_running_loop().create_future()
            self.grants[tag] = grant
            await send_message(self.control, TransferRequest(
                tag=tag, link=link, src=self.config.gpu, dst=peer.gpu, kind=kind.value,
                replica=self.config.replica, stage=self.config.stage,
                microbatch=microbatch if microbatch is not None else -1,
                nbytes=len(payload), iteration=iteration, ready_at=queued))
            await grant
            self.span(
                "wait_grant",
                queued,
                clock.now(),
                iteration,
                microbatch=microbatch,
                link=link,
                peer=peer.gpu,
            )
        start = clock.now()
        modeled_bps = self.config.intra_dc_bps if link is None and pipeline else None
        if modeled_bps:
            await self.send_modeled(peer, tag, len(payload), modeled_bps)
        else:
            await self.transport.send(peer.index, tag, payload)
        if link is not None and pipeline and link in self.config.arbitrated:
            # the last byte has left: the link is free for the next transfer
            await send_message(self.control, Sent(tag))
        self.span(
            "send",
            start,
            clock.now(),
            iteration,
            microbatch=microbatch,
            peer=peer.gpu,
            bytes=len(payload),
            link=link,
            tag=tag,
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
        payload: bytes,
        iteration: int,
        microbatch: int | None,
        kind: Op,
    ) -> asyncio.Task[None]:
        task = asyncio.create_task(self.send(peer, tag, payload, iteration, microbatch, kind))
        self.pending_sends.append(task)
        return task

    async def wait_send(self, step: SendWait, iteration: int) -> None:
        """Until the send has left and the receiving host has acknowledged its last byte."""
        start = clock.now()
        peer = self.neighbour(step.to_stage)
        await self.sending.pop((step.phase, step.microbatch))
        await self.transport.acknowledged(peer.index)
        self.span("wait_send", start, clock.now(), iteration, microbatch=step.microbatch,
                  peer=peer.gpu)

    async def receive(
        self, peer: PeerInfo, tag: str, iteration: int, microbatch: int | None
    ) -> bytearray:
        start = clock.now()
        action = self.action
        if self.config.bubbles and not self.transport.has(tag):
            await self.fill_bubble(lambda: not self.transport.has(tag), action, iteration,
                                   start)
        got = await self.transport.recv(tag)
        now = clock.now()
        self.span("recv", start, now, iteration, microbatch=microbatch, peer=peer.gpu,
                  action=action, waited=max(0.0, got.completed_at - start))
        link = self.link_key(peer)
        modeled = link is None and bool(self.config.intra_dc_bps)
        self.span(
            "transfer",
            got.sent_at,
            got.completed_at,
            iteration,
            microbatch=microbatch,
            peer=peer.gpu,
            bytes=self.config.activation_bytes if modeled else len(got.data),
            modeled=modeled,
            link=None if link is None else f"{peer.dc}>{self.config.dc}",
            tag=tag,
            src=peer.gpu,
            dst=self.config.gpu,
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
        from testbed.runtime.decode import write_kv

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
