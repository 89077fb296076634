"""A stage's all-reduces on the worker: whom it meets (the collective's group, in ring
order), under which name (the k-th join of that group: members meet by order), waited
for at once (ALLREDUCE) or started on a task of its own while the stage computes on
(ALLREDUCE_START) and awaited later (ALLREDUCE_WAIT).

Across DCs the contribution's bytes cross real TCP, each chunk a transfer span; inside one
DC with emulated compute a ring of tokens keeps the members in step and the collective's
closed-form time is waited out
(testbed.emulator.runtime.coordinator.worker_setup.modeled_collective).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, Unpack

from testbed.common.spans import SpanDetail, SpanKind
from testbed.emulator.runtime.wire.messages import CollectiveSetup, Config, PeerInfo
from testbed.emulator.runtime.worker.collectives.allreduce import (
    Bytes,
    Contribution,
    Wire,
    ring_allgather,
    ring_allreduce,
)
from testbed.emulator.runtime.worker.collectives.in_backward import InBackward
from testbed.emulator.runtime.worker.compute.engines import Engine
from testbed.emulator.runtime.worker.compute.zeros import zeros
from testbed.emulator.runtime.worker.transport import clock
from testbed.emulator.runtime.worker.transport.transport import Received, Transport
from testbed.plan.buckets import bucket_ready
from testbed.plan.collective import Collective, Scope
from testbed.plan.interpret import ReduceStart, Send, Step
from testbed.plan.model import Op


class Runner(Protocol):
    """What of the stage runner (testbed.emulator.runtime.worker.stage_runner) its
    collectives use."""

    config: Config
    engines: Mapping[int, Engine]
    transport: Transport
    executor: concurrent.futures.ThreadPoolExecutor
    action: int

    def span(self, kind: SpanKind, start: float, end: float, iteration: int,
             **detail: Unpack[SpanDetail]) -> None: ...

    async def send(self, peer: PeerInfo, tag: str, payload: bytes | bytearray | memoryview,
                   iteration: int, microbatch: int | None, kind: Op, stage: int,
                   collective: str = "") -> None: ...

    async def fill_bubble(self, waiting: Callable[[], bool], action: int, iteration: int,
                          since: float) -> None: ...

    def link_key(self, peer: PeerInfo) -> str | None: ...


@dataclass
class Joined:
    """A collective this stage has joined and not yet taken the result of."""

    setup: CollectiveSetup
    contribution: Contribution
    moving: asyncio.Task[float]
    """The ring; its result is when it ended."""
    start: float
    iteration: int
    action: int | None
    """The joining action's position, for a blocking one (bubble predictions key on it)."""


class Collectives:
    """A worker's collectives, of each stage its GPU holds (each stage reduces its own)."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self.setups = {(s.stage, Collective.parse(s.collective)): s
                       for s in runner.config.collectives}
        self.joins: collections.Counter[str] = collections.Counter()
        self.started: dict[tuple[int, Collective], Joined] = {}
        self.early: dict[tuple[int, Collective], asyncio.Future[None]] = {}
        """STARTs in a backward, until the runner gets to them: started once the
        backward has their values (testbed.emulator.runtime.worker.compute.bucket_hooks)."""

    def in_backward(self, steps: Sequence[Step], index: int, iteration: int
                    ) -> list[tuple[int, InBackward]]:
        """The STARTs in the backward of the compute at `index` (sends between them
        aside), by stage, as the engine starts them."""
        cfg, found = self.runner.config, []
        for step in steps[index + 1 :]:
            if isinstance(step, ReduceStart) and step.backward == index:
                key = (step.stage, step.collective)
                setup = self.setups[key]
                members = len(setup.group)
                self.early[key] = asyncio.get_running_loop().create_future()
                found.append((step.stage, InBackward(
                    step.collective,
                    bucket_ready(cfg.model, tuple(cfg.layers), step.stage, step.collective),
                    4 * members if setup.modeled_s is not None else setup.nbytes, members,
                    self._starter(step.collective, step.stage, iteration))))
            elif not isinstance(step, Send):
                break
        return found

    def _starter(self, collective: Collective, stage: int, iteration: int
                 ) -> Callable[[Contribution], None]:
        """What the engine calls, on the compute thread, with the bucket's contribution."""
        loop = asyncio.get_running_loop()

        def started(contribution: Contribution) -> None:
            loop.call_soon_threadsafe(self._begin, collective, stage, iteration,
                                      contribution, clock.now())

        return started

    def _begin(self, collective: Collective, stage: int, iteration: int,
               contribution: Contribution, start: float) -> None:
        setup = self.setups[(stage, collective)]
        tag = self.tag_of(collective, stage)
        moving = asyncio.create_task(self.move(collective, setup, contribution, tag, start,
                                               iteration))
        self.started[(stage, collective)] = Joined(setup, contribution, moving, start,
                                                   iteration, None)
        self.early[(stage, collective)].set_result(None)

    async def allreduce(self, collective: Collective, stage: int, iteration: int) -> None:
        """Join and wait for the result; with bubbles, prefills fill the wait once the
        contribution is out of the GPU's hands."""
        joined = await self.join(collective, stage, iteration, self.runner.action)
        await self.take(collective, joined)

    async def start(self, collective: Collective, stage: int, iteration: int) -> None:
        early = self.early.pop((stage, collective), None)
        if early is not None:  # started in the backward before it
            await early
            return
        if (stage, collective) in self.started:
            raise RuntimeError(f"{collective!r} of stage {stage} is already under way")
        self.started[(stage, collective)] = await self.join(collective, stage, iteration, None)

    async def wait(self, collective: Collective, stage: int, iteration: int) -> None:
        joined = self.started.pop((stage, collective), None)
        if joined is None:
            raise RuntimeError(f"{collective!r} of stage {stage} was never started")
        blocked, action = clock.now(), self.runner.action
        await self.take(collective, joined, iteration)
        # the time the stage actually waited, as the simulator records it
        self.runner.span("wait_reduce", blocked, clock.now(), iteration, action=action,
                         collective=str(collective), stage=stage)

    async def drain(self) -> None:
        """Let rings started and never awaited (a run that ends mid-cycle) finish: their
        members are still in them. Their results go unused."""
        started, self.started = self.started, {}
        for (_, collective), joined in started.items():
            self.record(collective, joined, await joined.moving)

    def tag_of(self, collective: Collective, stage: int) -> str:
        """The next join's name in the collective's group: every member counts its joins
        of the group alike."""
        cfg = self.runner.config
        group = f"AR{stage}" + (f"@{cfg.dc}" if collective.scope is Scope.DC else "")
        k = self.joins[group]
        self.joins[group] += 1
        return f"{group}:{k}"

    async def join(self, collective: Collective, stage: int, iteration: int,
                   action: int | None) -> Joined:
        runner = self.runner
        setup = self.setups[(stage, collective)]
        start = clock.now()
        tag = self.tag_of(collective, stage)
        members = len(setup.group)
        if setup.modeled_s is not None:  # emulated compute: no bytes move, GBs stay unmade
            contribution: Contribution = Bytes(bytearray(4 * members), members)
        else:
            contribution = await asyncio.get_running_loop().run_in_executor(
                runner.executor, runner.engines[stage].contribute, collective, setup.nbytes,
                members)
        moving = asyncio.create_task(self.move(collective, setup, contribution, tag, start,
                                               iteration))
        return Joined(setup, contribution, moving, start, iteration, action)

    async def take(self, collective: Collective, joined: Joined,
                   waiting_in: int | None = None) -> None:
        """Wait for the ring and take its result (on the compute thread, in program
        order); the span covers the ring from the join."""
        runner = self.runner
        if runner.config.bubbles:
            since = clock.now() if waiting_in is not None else joined.start
            await runner.fill_bubble(lambda: not joined.moving.done(), runner.action,
                                     joined.iteration if waiting_in is None else waiting_in,
                                     since)
        ended = await joined.moving
        members = len(joined.setup.group)
        await asyncio.get_running_loop().run_in_executor(
            runner.executor, runner.engines[joined.setup.stage].reduced, collective,
            joined.contribution, members)
        self.record(collective, joined, ended if joined.action is None else clock.now())

    def record(self, collective: Collective, joined: Joined, end: float) -> None:
        detail: SpanDetail = {"bytes": joined.setup.nbytes, "collective": str(collective),
                              "stage": joined.setup.stage}
        if joined.setup.modeled_s is not None:
            detail["modeled"] = True
        if joined.action is not None:
            detail["action"] = joined.action
        self.runner.span("allreduce", joined.start, end, joined.iteration, **detail)

    async def move(self, collective: Collective, setup: CollectiveSetup,
                   contribution: Contribution, tag: str, start: float, iteration: int) -> float:
        """The ring itself; returns when it ended."""
        runner, cfg = self.runner, self.runner.config
        group = setup.group
        position = next(i for i, p in enumerate(group) if p.index == cfg.index)
        successor = group[(position + 1) % len(group)]
        predecessor = group[(position - 1) % len(group)]
        modeled = setup.modeled_s is not None

        async def send(name: str, data: Wire) -> None:
            await runner.send(successor, name, data, iteration, None, Op.ALLREDUCE,
                              setup.stage, str(collective))

        all_in = start  # a modeled ring's: when every member had joined, as far as known

        async def receive(name: str) -> Wire:
            nonlocal all_in
            got = await self.receive(predecessor, name, iteration, modeled, setup.stage)
            all_in = max(all_in, got.sent_at)
            return zeros(got.nbytes) if got.data is None else got.data

        if modeled:
            # inside one DC, in emulated compute: a real ring over a token-sized buffer
            # keeps the members in step as the collective does. Its time is modeled from
            # when the last member joined, for every member, as the simulator times it
            # (from a member's own join, early members ran ahead of a late one). A ring
            # message goes out once its sender has joined and received the step before,
            # so the token of step n-1 on was sent after every member joined; the token's
            # own trip is part of the modeled time, not added to it.
            await ring_allreduce(contribution, position, len(group), tag, send, receive)
            assert setup.modeled_s is not None
            left = setup.modeled_s - (clock.now() - all_in)
            if left > 0:
                await asyncio.sleep(left)
        elif collective.gathers:
            await ring_allgather(contribution, position, len(group), tag, send, receive)
        else:
            await ring_allreduce(contribution, position, len(group), tag, send, receive)
        return clock.now()

    async def receive(self, peer: PeerInfo, tag: str, iteration: int,
                      modeled: bool, stage: int) -> Received:
        """A ring message from the predecessor; a transfer span when its bytes are the
        collective's own (not a modeled ring's token). Where the transport keeps only
        sizes, the caller puts zeros of its size in its place: a ring passes on what
        it received."""
        runner = self.runner
        got = await runner.transport.recv(tag)
        if not modeled:
            link = runner.link_key(peer)
            runner.span("transfer", got.sent_at, got.completed_at, iteration, microbatch=None,
                        peer=peer.gpu, bytes=got.nbytes,
                        link=None if link is None else f"{peer.dc}>{runner.config.dc}",
                        tag=tag, src=peer.gpu, dst=runner.config.gpu, stage=stage)
        return got
