"""The coordinator owns an emulated run: hosts up, one worker per GPU, the plan handed
out, telemetry, arbitration and bubble filling during training, and everything torn down
in reverse order on success, error, Ctrl-C, SIGTERM or a dead worker.

Its parts: RunConfig (what was asked), Hosts (where processes live: injected, so tests
drive the control logic with local fake workers), WorkerPool (processes), ControlServer
(who joins, start-up), ArbiterBridge and BubbleBridge (the shared policy machinery over
the control channel), Telemetry (what workers report).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass, field

from testbed.common.choices import EmulatedCompute, Status
from testbed.common.spans import Span
from testbed.common.units import plural
from testbed.emulator.net.layout import check_limits
from testbed.emulator.net.network import Progress as Say
from testbed.emulator.runtime.coordinator.arbiter_bridge import ArbiterBridge, Granted
from testbed.emulator.runtime.coordinator.bubble_bridge import BubbleBridge
from testbed.emulator.runtime.coordinator.cluster_run import (
    ClusterJoins,
    share_order,
    start_across_machines,
)
from testbed.emulator.runtime.coordinator.control_server import ControlServer
from testbed.emulator.runtime.coordinator.failure import Failure, Interrupted, RunFailed, to_the_end
from testbed.emulator.runtime.coordinator.health import (
    CpuSample,
    Health,
    assess_run,
    process_cpu_ticks,
    read_cpu,
)
from testbed.emulator.runtime.coordinator.hosts import Hosts, NamespaceHosts, WanSocket
from testbed.emulator.runtime.coordinator.memory import MemoryUse, coordinator_peak, measured_memory
from testbed.emulator.runtime.coordinator.pool import WorkerHandle, WorkerPool
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.emulator.runtime.coordinator.telemetry import Telemetry
from testbed.emulator.runtime.coordinator.timed import TimedChanges
from testbed.emulator.runtime.coordinator.worker_setup import worker_config, worker_connections
from testbed.emulator.runtime.wire.arbitration import Grant, Sent, TransferRequest
from testbed.emulator.runtime.wire.messages import (
    BubbleAsk,
    CheckpointWritten,
    Done,
    Idle,
    IterationDone,
    KvDelivered,
    Start,
    WorkerError,
    receive,
)
from testbed.emulator.runtime.wire.protocol import ProtocolError
from testbed.emulator.runtime.wire.secret import run_token
from testbed.errors import TestbedError
from testbed.inference.bubbles import BubbleBroker, make_broker
from testbed.job.model import Job
from testbed.metrics.summary import Summary, summarize
from testbed.plan.model import Plan
from testbed.plan.throughput import tokens_per_iteration, wan_capacity_bps
from testbed.run.dilation import busiest_spans_per_second
from testbed.topology.model import Topology
from testbed.topology.net_events import event_spans

__all__ = ["Coordinator", "Interrupted", "RunFailed", "RunOutcome"]

STARTUP_TIMEOUT_S = 120.0


@dataclass
class RunOutcome:
    compute: EmulatedCompute
    spans: list[Span]
    losses: dict[int, float]
    start: float
    summary: Summary
    status: Status = "ok"
    error: str | None = None
    wall_s: float = 0.0
    shaper: str | None = None
    health: Health | None = None
    memory: MemoryUse | None = None
    synced_losses: dict[int, float] = field(default_factory=dict)
    """The synchronized model's loss by iteration (a DiLoCo-family run, real compute)."""
    wan_sockets: list[WanSocket] = field(default_factory=list)
    """The hosts' TCP sockets to other DCs as training ended (Hosts.wan_sockets)."""


class Coordinator:
    def __init__(self, config: RunConfig, hosts: Hosts | None = None,
                 say: Say = print) -> None:
        self.config = config
        self.say = say
        across = config.cluster
        self.hosts: Hosts = hosts or NamespaceHosts(
            config.shaper, say, config.job.seed, across.cluster if across else None,
            across.machine if across else None)
        self.nonce = secrets.token_hex(16)
        """In a run across machines, the token follows from it and the cluster's secret."""
        self.token = run_token(across.secret, self.nonce) if across else secrets.token_hex(32)
        self.control = ControlServer(self.token)
        self.pool = WorkerPool(self.hosts, config.log_dir, self.token, self._fail,
                               across.machine if across else None)
        self._joins: ClusterJoins | None = None
        self.telemetry = Telemetry(len(config.plan.used_gpus()), config.plan.dp,
                                   config.job.iterations, config.dilation)
        self.broker: BubbleBroker | None = None
        self.outcome: RunOutcome | None = None
        self._failure: Failure | None = None
        self._arbiter: ArbiterBridge | None = None
        self._bubbles: BubbleBridge | None = None
        self.timed: TimedChanges | None = None
        """Network events and the scenario's failures, once training started."""
        self._cpu: tuple[CpuSample, CpuSample] | None = None
        self._worker_ticks: int | None = None
        """Clock ticks the workers used during training."""
        self._lateness: tuple[float, float] | None = None
        self._sockets: list[WanSocket] = []

    @property
    def topology(self) -> Topology:
        return self.config.topology

    @property
    def job(self) -> Job:
        return self.config.job

    @property
    def plan(self) -> Plan:
        return self.config.plan

    @property
    def workers(self) -> list[WorkerHandle]:
        return self.pool.workers

    # --- the run ---------------------------------------------------------------------

    async def run(self) -> RunOutcome:
        started = time.monotonic()
        self._failure = Failure()
        status: Status = "ok"
        error: str | None = None
        try:
            await self._setup()
            await self._train()
        except asyncio.CancelledError:
            status, error = "interrupted", "interrupted"
            raise
        except (TestbedError, OSError) as exc:
            status, error = "failed", str(exc)
            raise RunFailed(str(exc)) from None
        finally:
            self.outcome = self._outcome(status, error, time.monotonic() - started)
            await to_the_end(self._teardown())
        return self.outcome

    def _fail(self, message: str) -> None:
        if self._failure is not None:
            self._failure.fail(message)

    async def _setup(self) -> None:
        config = self.config
        if config.plan.tp != 1:
            raise TestbedError(
                f"the emulator runs one worker per GPU without tensor parallelism (plan "
                f"has tp {config.plan.tp}); use `testbed simulate` for tensor-parallel jobs")
        check_limits(config.topology)
        self.broker = make_broker(config.topology, config.job, config.plan,
                                  config.bubble_policy, config.bubble_options,
                                  config.bubble_seed)
        decode_dcs = config.decode_dcs(self.broker is not None)
        await to_the_end(asyncio.to_thread(self.hosts.bring_up, config.topology, decode_dcs))
        self.pool.plan_workers(config.plan, decode_dcs)
        self.say(f"starting {plural(len(self.pool.workers), 'worker')} ({config.compute} "
                 "compute)" + (f" and {plural(len(self.pool.decoders), 'decode server')}"
                    if self.pool.decoders else ""))
        timeout = STARTUP_TIMEOUT_S
        if config.cluster is None:
            socket_path = self.hosts.control_dir() / "control.sock"
            await self.control.listen(socket_path)
            await self.pool.start(socket_path)
        else:
            if not isinstance(self.hosts, NamespaceHosts):
                raise TestbedError("a run across machines needs the emulated network's hosts")
            share = share_order(config.topology, decode_dcs, config.cluster, config.shaper,
                                config.job.seed)
            self._joins = await start_across_machines(
                config.cluster, self.pool, self.control, self.hosts, share, self.nonce,
                self.say, self._fail)
            timeout = config.cluster.join_timeout_s
        assert self._failure is not None
        everyone = self.pool.workers
        try:
            if self._joins is not None:  # no data connection before every path exists
                started = time.monotonic()
                await asyncio.wait_for(self._failure.race(self._joins.shares_ready()),
                                       timeout)
                timeout -= time.monotonic() - started
            await asyncio.wait_for(self.control.handshake(
                everyone, self.pool.decoders,
                lambda w: worker_config(config, w, everyone, self.hosts.address_of, decode_dcs),
                lambda w: worker_connections(config, w, everyone, self.hosts.address_of),
                self._failure), timeout)
        except TimeoutError:
            waiting = self._joins.missing() if self._joins else ""
            raise RunFailed(f"the workers did not all start within {timeout:g} s"
                            + (f"; not joined: {waiting} (torchrun starts a machine's "
                               "processes only once every machine has met at its "
                               "rendezvous)" if waiting else "")) from None

    async def _train(self) -> None:
        config, telemetry = self.config, self.telemetry
        start = time.monotonic()
        telemetry.begin(start)
        self._arbiter = ArbiterBridge(config.policy, config.plan, start)
        if self.broker is not None:
            self._bubbles = BubbleBridge(self.broker, config.topology, config.job, start)
        for worker in self.pool.workers:
            await worker.tell(Start(start))
        plan = config.plan
        virtual = f" (x {plan.stages_per_gpu} virtual stages)" if plan.stages_per_gpu > 1 else ""
        self.say(f"training: {plural(config.job.iterations, 'iteration')}, dp {plan.dp} x pp "
                 f"{plan.gpus_per_pipeline}{virtual}, "
                 f"{plural(plan.microbatches, 'microbatch', 'microbatches')}")
        readers = [asyncio.create_task(self._serve(w)) for w in self.pool.workers]
        decoding = [asyncio.create_task(self._serve_decoder(d)) for d in self.pool.decoders]
        stall = asyncio.create_task(self._stall_watch())
        timed = self.timed = TimedChanges(config, self.hosts, self._joins, self.say, self._fail)
        events = asyncio.create_task(timed.apply_events(telemetry.start))
        losing = asyncio.create_task(timed.lose_workers(telemetry.start, self.pool.workers))
        gathered = asyncio.gather(*readers)
        cpu_before = read_cpu()
        pids = self.pool.pids()
        ticks_before = process_cpu_ticks(pids)
        try:
            assert self._failure is not None
            await self._failure.race(gathered)
            self._worker_ticks = process_cpu_ticks(pids) - ticks_before
            self._cpu = (cpu_before, read_cpu())
            self._lateness = await asyncio.to_thread(self.hosts.lateness)
            self._sockets = await asyncio.to_thread(self.hosts.wan_sockets)
        finally:
            stall.cancel()
            events.cancel()
            losing.cancel()
            for task in decoding:
                task.cancel()
            gathered.cancel()
            with contextlib.suppress(BaseException):
                await gathered

    # --- during training ---------------------------------------------------------------

    async def _serve(self, worker: WorkerHandle) -> None:
        """One worker's messages until it is done."""
        assert worker.reader is not None
        while True:
            try:
                message = await receive(worker.reader)
            except (asyncio.IncompleteReadError, OSError) as exc:
                if worker.process is not None:
                    await asyncio.sleep(0.5)  # let the process watcher name the exit code
                how = "closed" if not isinstance(exc, TimeoutError) else "lost (timed out)"
                self._fail(f"worker {worker.describe()} {how} its control connection")
                return
            except ProtocolError as exc:
                self._fail(f"worker {worker.describe()}: {exc}")
                return
            match message:
                case IterationDone():
                    line = self.telemetry.on_iteration(worker.gpu, message)
                    if self._bubbles is not None:
                        self._bubbles.learn(message.spans)
                    if line:
                        self.say(line)
                case TransferRequest():
                    assert self._arbiter is not None
                    await _grant(self._arbiter.request(worker, message))
                case Sent(tag=tag):
                    assert self._arbiter is not None
                    await _grant(self._arbiter.sent(tag))
                case BubbleAsk():
                    await worker.tell(Idle() if self._bubbles is None else
                                      self._bubbles.on_bubble(worker.gpu, message,
                                                              time.monotonic()))
                case CheckpointWritten(done=done):
                    await self._checkpointed(worker, done)
                case WorkerError():
                    self.telemetry.spans.extend(message.spans)
                    # a peer's death shows up here first; let the watcher name the dead one
                    await asyncio.sleep(0.5 if "PeerLost" in message.message else 0)
                    self._fail(f"worker {worker.describe()} failed in iteration "
                               f"{message.iteration}: {message.message}")
                    return
                case Done():
                    worker.finished = True
                    self.telemetry.synced_losses.update(
                        {int(i): loss for i, loss in message.synced_losses.items()})
                    return
                case _:
                    self._fail(f"worker {worker.describe()} sent an unexpected "
                               f"{message.op!r} message")
                    return

    async def _checkpointed(self, worker: WorkerHandle, done: int) -> None:
        checkpoints = self.config.checkpoints
        if checkpoints is not None and checkpoints.part_written(done, worker.gpu):
            telemetry = self.telemetry
            await asyncio.to_thread(checkpoints.commit, done, dict(telemetry.losses),
                                    list(telemetry.spans), telemetry.start)

    async def _serve_decoder(self, decoder: WorkerHandle) -> None:
        """KV caches arriving at a decode server: each one is a request's first token."""
        assert decoder.reader is not None
        while True:
            try:
                message = await receive(decoder.reader, KvDelivered)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            except ProtocolError as exc:
                self._fail(f"{decoder.describe()}: {exc}")
                return
            if self._bubbles is not None and isinstance(message, KvDelivered):
                self._bubbles.on_kv(message)

    async def _stall_watch(self) -> None:
        """Ends a run that stopped moving, naming who holds it up; a broken network is
        reported as what it is within a second."""
        config = self.config
        while True:
            await asyncio.sleep(1.0)
            broken = self.hosts.broken()
            if broken:
                self._fail(broken)
                return
            if self.telemetry.stalled_for() > config.stall_timeout_s:
                held = self.timed.down if self.timed else None
                down = f" (network event: {held.describe()})" if held else ""
                first = config.checkpoints.first_iteration if config.checkpoints else 0
                stuck = self.telemetry.stuck(self.pool.workers, first)
                self._fail(
                    f"no progress for {config.stall_timeout_s / config.dilation:g} s"
                    + (f" (x{config.dilation} dilated)" if config.dilation > 1 else "")
                    + f"; stuck: {stuck}{down}")
                return

    # --- the end ---------------------------------------------------------------------

    def _outcome(self, status: Status, error: str | None, wall: float) -> RunOutcome:
        config, telemetry = self.config, self.telemetry
        tokens = tokens_per_iteration(config.job, config.plan)
        capacity = wan_capacity_bps(config.topology, config.plan)
        own_start = telemetry.start
        start, carried, losses = (
            config.checkpoints.carried_over(own_start, telemetry.losses)
            if config.checkpoints else (own_start, [], telemetry.losses))
        summary = summarize(carried + telemetry.spans, config.plan.used_gpus(), start, tokens,
                            capacity, config.plan.period)
        end = max((s["end"] for s in telemetry.spans), default=own_start) - own_start
        spans = telemetry.spans + event_spans(config.events, own_start, end) \
            if own_start else telemetry.spans
        return RunOutcome(config.compute, carried + spans, losses, start, summary, status,
                          error, wall, self.hosts.shaper(), self._health(),
                          measured_memory(self.pool.peak_memory(), coordinator_peak()),
                          dict(telemetry.synced_losses), self._sockets)

    def _health(self) -> Health | None:
        if self._cpu is None:
            return None
        spans = self.telemetry.spans
        return assess_run(*self._cpu, self._worker_ticks, len(spans), self.telemetry.lags,
                          self._lateness, self.config.dilation,
                          busiest_spans_per_second(spans), self.config.action_cpu_s)

    async def _teardown(self) -> None:
        await self.pool.stop()
        self.control.close()
        if self._joins is not None:
            await self._joins.close()
        for problem in await asyncio.to_thread(self.hosts.tear_down):
            self.say(f"teardown: {problem}")


async def _grant(granted: Granted | None) -> None:
    if granted is not None:
        worker, tag = granted
        await worker.tell(Grant(tag))
