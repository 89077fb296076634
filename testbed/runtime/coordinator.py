"""The coordinator owns a run: network up, one worker per GPU in its namespace, the plan
handed out, telemetry and arbitration, and everything torn down in reverse order on
success, error, Ctrl-C, SIGTERM or a dead worker."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

from testbed.bubbles import BubbleBroker, make_broker
from testbed.compute import ring_allreduce_s, stage_cost
from testbed.errors import TestbedError
from testbed.events import NetEvent, changes, event_spans
from testbed.inference import kv_bytes, modeled_prefill_s
from testbed.job import Job
from testbed.metrics.summary import Summary, summarize
from testbed.net.layout import check_limits
from testbed.net.network import Network, bring_up, change_link, tear_down
from testbed.net.state import ProcessRecord, process_start_ticks, process_state
from testbed.pacing import GRADIENTS, paced, pair_pacing_bytes_per_s
from testbed.plan.build import PIPELINE, communicating_pairs
from testbed.plan.model import Op, Plan, Sharing
from testbed.policy.arbiter import Arbiter
from testbed.policy.base import Request, TrainingPolicy, Transfer
from testbed.runtime.checkpoint import Checkpoints
from testbed.runtime.decode import DECODE_PORT
from testbed.runtime.health import (
    CpuSample,
    Health,
    assess,
    busy_share,
    delay_line_lateness,
    process_cpu_ticks,
    read_cpu,
)
from testbed.runtime.protocol import ProtocolError, read_message, send_message
from testbed.runtime.worker import TOKEN_ENV
from testbed.sim.simulate import tokens_per_iteration, wan_capacity_bps
from testbed.topology.model import Topology

Progress = Callable[[str], None]
STARTUP_TIMEOUT_S = 120.0
STOP_GRACE_S = 5.0
HELLO_TIMEOUT_S = 5.0
"""How long a new control connection may take to say hello."""


class RunFailed(TestbedError):
    """The run could not finish; what was measured is still written."""


class Interrupted(TestbedError):
    """Ctrl-C or SIGTERM during a run."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__("interrupted" if signum == signal.SIGINT else "terminated")


T = TypeVar("T")


@dataclass
class WorkerHandle:
    index: int
    gpu: str
    replica: int
    stage: int
    netns: str
    process: asyncio.subprocess.Process | None = None
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    port: int = 0
    log: TextIO | None = None
    log_path: Path | None = None
    finished: bool = False

    def describe(self) -> str:
        return f"{self.gpu} (replica {self.replica}, stage {self.stage})"

    def last_log_line(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln]
        return lines[-1] if lines else ""


@dataclass
class RunOutcome:
    network: Network | None
    compute: str
    spans: list[dict[str, Any]]
    losses: dict[int, float]
    start: float
    summary: Summary
    status: str = "ok"
    error: str | None = None
    wall_s: float = 0.0
    shaper: str | None = None
    health: Health | None = None


@dataclass
class Coordinator:
    topology: Topology
    job: Job
    plan: Plan
    policy: TrainingPolicy
    compute: str
    log_dir: Path
    shaper: str = "auto"
    stall_timeout_s: float = 120.0
    say: Progress = print
    save_dir: Path | None = None
    """Where workers write their stage's final parameters (real compute)."""
    allreduce: str = "auto"
    pacing: bool = True
    """Cap each cross-DC connection at its share of the path's rate (testbed.pacing)."""
    activations: str = "auto"
    """"auto": with emulated compute, activations between stages in one DC are modeled at
    the DC's bandwidth; "real": they cross the network as real bytes."""
    bubble_policy: str | None = None
    bubble_options: dict[str, str] | None = None
    events: tuple[NetEvent, ...] = ()
    """Network events applied during training, at times from its start."""
    broker: BubbleBroker | None = None
    decoders: list[WorkerHandle] = field(default_factory=list)
    _admitted: dict[int, Request] = field(default_factory=dict)
    """"real": send every gradient byte; "auto": model intra-DC rings in emulated compute."""
    network: Network | None = None
    workers: list[WorkerHandle] = field(default_factory=list)
    spans: list[dict[str, Any]] = field(default_factory=list)
    losses: dict[int, float] = field(default_factory=dict)
    iterations_seen: dict[int, set[str]] = field(default_factory=dict)
    start: float = 0.0
    token: str = field(default_factory=lambda: secrets.token_hex(32))
    _hello: asyncio.Queue[tuple[asyncio.StreamReader, asyncio.StreamWriter,
                                dict[str, Any]]] = field(default_factory=asyncio.Queue)
    """Connections to the control socket that said hello in time, with what they said."""
    _failure: asyncio.Future[str] | None = None
    _last_progress: float = 0.0
    _arbiter: Arbiter | None = None
    _pending: dict[str, Transfer] = field(default_factory=dict)
    _granted_to: dict[str, WorkerHandle] = field(default_factory=dict)
    _transfer_ids: int = 0
    outcome: RunOutcome | None = None
    _watchers: list[asyncio.Task[None]] = field(default_factory=list)
    _down: NetEvent | None = None
    _started: bool = False
    dilation: int = 1
    """Real seconds per represented second; the topology and times given are dilated."""
    lags: list[float] = field(default_factory=list)
    _cpu: tuple[CpuSample, CpuSample] | None = None
    _worker_ticks: int | None = None
    """Clock ticks the workers used during training."""
    _lateness: tuple[float, float] | None = None
    checkpoints: Checkpoints | None = None
    """Where and how often the run checkpoints, and what it resumed from (if it did)."""

    # --- the run ---------------------------------------------------------------------

    async def run(self) -> RunOutcome:
        started = time.monotonic()
        self._failure = asyncio.get_running_loop().create_future()
        status, error = "ok", None
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
            await _to_the_end(self._teardown())
        return self.outcome

    def _outcome(self, status: str, error: str | None, wall: float) -> RunOutcome:
        gpus = self.plan.used_gpus()
        tokens = tokens_per_iteration(self.job, self.plan)
        capacity = wan_capacity_bps(self.topology, self.plan)
        start, carried, losses = (self.checkpoints.carried_over(self.start, self.losses)
                                  if self.checkpoints else (self.start, [], self.losses))
        summary = summarize(carried + self.spans, gpus, start, tokens, capacity)
        end = max((s["end"] for s in self.spans), default=self.start) - self.start
        spans = self.spans + event_spans(self.events, self.start, end) if self.start else self.spans
        return RunOutcome(
            self.network,
            self.compute,
            carried + spans,
            losses,
            start,
            summary,
            status,
            error,
            wall,
            self.network.shaper.value if self.network else None,
            self._health(),
        )

    def _health(self) -> Health | None:
        if self._cpu is None:
            return None
        before, after = self._cpu
        elapsed = after.total - before.total  # over all cores, in the same clock ticks
        workers = self._worker_ticks / elapsed if self._worker_ticks is not None and elapsed \
            else None
        return assess(busy_share(before, after), self.lags, self._lateness, self.dilation,
                      workers)

    async def _setup(self) -> None:
        if self.plan.tp != 1:
            raise TestbedError(
                f"the emulator runs one worker per GPU without tensor "
                f"parallelism (plan has tp {self.plan.tp}); use `testbed "
                "simulate` for tensor-parallel jobs"
            )
        check_limits(self.topology)
        self.broker = make_broker(self.topology, self.job, self.plan, self.bubble_policy,
                                  self.bubble_options)
        decode_dcs = self._decode_dcs() if self.broker is not None else ()
        def keep(network: Network) -> None:
            self.network = network

        await _to_the_end(asyncio.to_thread(
            bring_up, self.topology, self.shaper, self.say, False, self.job.seed, decode_dcs
        ), keep)
        assert self.network is not None
        control_dir = self.network.state.path.with_suffix("")
        control_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        socket_path = control_dir / "control.sock"
        server = await asyncio.start_unix_server(self._on_connect, path=str(socket_path))
        os.chmod(socket_path, 0o600)
        self._server = server
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for index, ((replica, stage), gpus) in enumerate(self.plan.workers()):
            gpu = gpus[0]
            self.workers.append(
                WorkerHandle(index, gpu, replica, stage, self.network.netns_of(gpu))
            )
        for dc in decode_dcs:
            name = f"{dc}-decode"
            self.decoders.append(WorkerHandle(-1, name, -1, -1, self.network.netns_of(name)))
        self.say(f"starting {len(self.workers)} workers ({self.compute} compute)"
                 + (f" and {len(self.decoders)} decode servers" if self.decoders else ""))
        for worker in self.workers:
            await self._spawn(worker, socket_path)
        for decoder in self.decoders:
            await self._spawn(decoder, socket_path, decode=True)
        await asyncio.wait_for(self._handshake(), STARTUP_TIMEOUT_S)

    async def _spawn(self, worker: WorkerHandle, socket_path: Path, decode: bool = False) -> None:
        assert self.network is not None
        worker.log_path = self.log_dir / f"{worker.gpu}.log"
        worker.log = worker.log_path.open("w")
        env = {**os.environ, TOKEN_ENV: self.token, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        if decode:
            args = ["testbed.runtime.decode", "--control", str(socket_path), "--name",
                    worker.gpu, "--address", self.network.address_of(worker.gpu)]
        else:
            args = ["testbed.runtime.worker", "--control", str(socket_path), "--gpu", worker.gpu]
        worker.process = await asyncio.create_subprocess_exec(
            "ip",
            "netns",
            "exec",
            worker.netns,
            sys.executable,
            "-m",
            *args,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=worker.log,
            stderr=worker.log,
        )
        pid = worker.process.pid
        self.network.state.processes.append(
            ProcessRecord(pid, process_start_ticks(pid) or 0, f"worker:{worker.gpu}")
        )
        self.network.state.save()
        self._watchers.append(asyncio.create_task(self._watch(worker)))

    async def _watch(self, worker: WorkerHandle) -> None:
        assert worker.process is not None
        code = await worker.process.wait()
        if not worker.finished:
            detail = worker.last_log_line()
            self._fail(
                f"worker {worker.describe()} exited with code {code}"
                + (f": {detail}" if detail else "")
            )

    def _fail(self, message: str) -> None:
        if self._failure is not None and not self._failure.done():
            self._failure.set_result(message)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._started:
            writer.close()  # every worker has joined: nobody else may
            return
        try:  # each connection on its own clock: a silent one holds up nobody
            msg = await asyncio.wait_for(read_message(reader), HELLO_TIMEOUT_S)
        except (TimeoutError, asyncio.IncompleteReadError, ValueError, ProtocolError,
                ConnectionError):
            writer.close()  # not our protocol: not one of ours
            return
        await self._hello.put((reader, writer, msg))

    async def _handshake(self) -> None:
        by_gpu = {w.gpu: w for w in [*self.workers, *self.decoders]}
        waiting = set(by_gpu)
        while waiting:
            reader, writer, msg = await self._race(self._hello.get())
            worker = by_gpu.get(msg.get("gpu", ""))
            if (
                msg.get("op") != "hello"
                or worker is None
                or worker.gpu not in waiting
                or not secrets.compare_digest(str(msg.get("token", "")), self.token)
            ):
                writer.close()  # not one of this run's workers
                continue
            worker.reader, worker.writer = reader, writer
            waiting.discard(worker.gpu)
            if worker not in self.decoders:
                await send_message(writer, self._config_for(worker))
        for decoder in self.decoders:
            await self._race(self._read(decoder))  # listening
        for worker in self.workers:
            msg = await self._race(self._read(worker))
            worker.port = int(msg["port"])
        for worker in self.workers:
            assert worker.writer is not None
            await send_message(worker.writer, self._connections_for(worker))
        for worker in self.workers:
            msg = await self._race(self._read(worker))
            if msg.get("op") != "ready":
                raise RunFailed(f"worker {worker.describe()} failed to connect: {msg}")
        self._started = True

    async def _read(self, worker: WorkerHandle) -> dict[str, Any]:
        assert worker.reader is not None
        try:
            msg = await read_message(worker.reader)
        except (asyncio.IncompleteReadError, ConnectionError):
            await asyncio.sleep(0.5)  # give the process watcher the chance to name the exit
            if self._failure is not None and self._failure.done():
                raise RunFailed(self._failure.result()) from None
            raise RunFailed(
                f"worker {worker.describe()} closed its control connection: "
                f"{worker.last_log_line() or 'no output'}"
            ) from None
        if msg.get("op") == "error":
            raise RunFailed(f"worker {worker.describe()}: {msg.get('message')}")
        return msg

    async def _race(self, awaitable: Any) -> Any:
        """Await something, unless a worker dies first."""
        assert self._failure is not None
        task = asyncio.ensure_future(awaitable)
        done, _ = await asyncio.wait({task, self._failure}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise RunFailed(self._failure.result())

    def _config_for(self, worker: WorkerHandle) -> dict[str, Any]:
        assert self.network is not None
        plan, job = self.plan, self.job
        index_of = {w.gpu: w.index for w in self.workers}
        dc = self.topology.dc_of(worker.gpu)

        def peer(gpu: str) -> dict[str, Any]:
            return {"index": index_of[gpu], "gpu": gpu, "dc": self.topology.dc_of(gpu)}

        stage = worker.stage
        first, last = stage == 0, stage == plan.pp - 1
        cost = stage_cost(job, plan.layers[stage], first, last, self.topology.gpu(worker.gpu).type)
        return {
            "op": "config",
            "index": worker.index,
            "gpu": worker.gpu,
            "dc": dc,
            "address": self.network.address_of(worker.gpu),
            "replica": worker.replica,
            "stage": stage,
            "actions": [str(a) for a in plan.actions[worker.gpu]],
            "prev": None if first else peer(plan.lead_gpu(worker.replica, stage - 1)),
            "next": None if last else peer(plan.lead_gpu(worker.replica, stage + 1)),
            "ring": [peer(plan.lead_gpu(r, stage)) for r in range(plan.dp)],
            "arbitrated": [
                f"{a}>{b}" for (a, b), s in plan.sharing.items() if s is Sharing.ARBITRATED
            ],
            "iterations": job.iterations,
            "compute": self.compute,
            "model": dict(job.model.__dict__),
            "layers": list(plan.layers),
            "seed": job.seed,
            "dp": plan.dp,
            "microbatches": plan.microbatches,
            "microbatch_size": plan.microbatch_size,
            "activation_bytes": job.activation_bytes,
            "grad_bytes": cost.grad_bytes,
            "emulated": {"forward_s": cost.forward_s, "backward_s": cost.backward_s, "step_s": 0.0},
            "local_rank": worker.index,
            "save_dir": str(self.save_dir) if self.save_dir else None,
            **(self.checkpoints.worker_config() if self.checkpoints else {}),
            "allreduce_modeled_s": self._modeled_allreduce(stage, cost.grad_bytes),
            "stretch": self.dilation if self.compute == "real" else 1,
            "intra_dc_bps": self.topology.dc(dc).bandwidth_bps
            if self.activations == "auto" and self.compute == "emulated" else None,
            "bubbles": self.broker is not None,
            "decode": self._decode_for(dc),
            "inference_model": dict(self.job.inference.model.__dict__)
            if self.job.inference else None,
        }

    def _decode_dcs(self) -> tuple[str, ...]:
        named = self.job.inference.decode_dc if self.job.inference else None
        if named and named != "local":
            return (named,)
        return tuple(dict.fromkeys(self.topology.dc_of(g) for g in self.plan.used_gpus()))

    def _decode_for(self, dc: str) -> dict[str, Any] | None:
        if self.broker is None or self.network is None:
            return None
        named = self._decode_dcs()
        target = dc if dc in named else named[0]
        return {"address": self.network.address_of(f"{target}-decode"), "port": DECODE_PORT}

    def _modeled_allreduce(self, stage: int, grad_bytes: int) -> float | None:
        """Seconds for an intra-DC all-reduce that is modeled instead of sent, or None.

        With emulated compute a stage's gradients (GBs for large models) would have to
        cross Python on this machine at intra-DC rates it cannot reach; inside one DC the
        ring is modeled at the DC's bandwidth unless `allreduce` is "real". Rings that
        cross the WAN always move real bytes.
        """
        if self.allreduce == "real" or self.compute == "real" or self.plan.dp < 2:
            return None
        dcs = {self.topology.dc_of(self.plan.lead_gpu(r, stage)) for r in range(self.plan.dp)}
        if len(dcs) != 1:
            return None
        dc = self.topology.dc(dcs.pop())
        return ring_allreduce_s(grad_bytes, self.plan.dp, dc.bandwidth_bps, dc.latency_s)

    def _connections_for(self, worker: WorkerHandle) -> dict[str, Any]:
        """Who dials whom: the lower-indexed worker of each pair opens the connections."""
        assert self.network is not None
        by_gpu = {w.gpu: w for w in self.workers}
        outbound: dict[str, Any] = {}
        inbound: dict[str, int] = {}
        pacing: dict[str, float] = {}
        for a, b, kind in communicating_pairs(self.plan.placement, self.plan.dp, self.plan.pp, 1):
            n = self.plan.connections_between(a, b)
            wa, wb = by_gpu[a], by_gpu[b]
            low, high = (wa, wb) if wa.index < wb.index else (wb, wa)
            rate = self._pacing_rate(a, b, n, kind)
            if rate and worker in (wa, wb):
                pacing[str((wb if worker is wa else wa).index)] = rate
            if worker is low:
                outbound[str(high.index)] = {
                    "address": self.network.address_of(high.gpu),
                    "port": high.port,
                    "connections": n,
                }
            elif worker is high:
                inbound[str(low.index)] = n
        return {"op": "connect", "outbound": outbound, "inbound": inbound, "pacing": pacing}

    def _pacing_rate(self, a: str, b: str, connections: int, kind: str) -> float | None:
        """Bytes per second for each of a cross-DC pair's connections: together they leave
        at the path's rate, or None when unpaced (testbed.pacing)."""
        dc_a, dc_b = self.topology.dc_of(a), self.topology.dc_of(b)
        largest = self.job.activation_bytes if kind == PIPELINE else GRADIENTS
        if not self.pacing or not paced(self.topology, dc_a, dc_b, largest):
            return None
        return pair_pacing_bytes_per_s(self.topology.bottleneck_bps(dc_a, dc_b), connections)

    async def _train(self) -> None:
        self._arbiter = Arbiter(self.policy, self.plan)
        self.start = time.monotonic()
        self._last_progress = self.start
        for worker in self.workers:
            assert worker.writer is not None
            await send_message(worker.writer, {"op": "start", "t0": self.start})
        self.say(
            f"training: {self.job.iterations} iterations, dp {self.plan.dp} x pp "
            f"{self.plan.pp}, {self.plan.microbatches} microbatches"
        )
        readers = [asyncio.create_task(self._serve(w)) for w in self.workers]
        decoding = [asyncio.create_task(self._serve_decoder(d)) for d in self.decoders]
        stall = asyncio.create_task(self._stall_watch())
        events = asyncio.create_task(self._apply_events())
        gathered = asyncio.gather(*readers)
        cpu_before = read_cpu()
        pids = [w.process.pid for w in self.workers if w.process is not None]
        ticks_before = process_cpu_ticks(pids)
        try:
            await self._race(gathered)
            self._worker_ticks = process_cpu_ticks(pids) - ticks_before
            self._cpu = (cpu_before, read_cpu())
            assert self.network is not None
            self._lateness = delay_line_lateness(
                await asyncio.to_thread(self.network.delay_line_stats))
        finally:
            stall.cancel()
            events.cancel()
            for task in decoding:
                task.cancel()
            gathered.cancel()
            with contextlib.suppress(BaseException):
                await gathered

    async def _apply_events(self) -> None:
        """Change the links at the events' times; a failure to apply one ends the run."""
        assert self.network is not None
        for change in changes(self.events, self.topology):
            delay = self.start + change.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if change.event is not None:
                verb = "ends" if change.revert else "starts"
                self.say(f"network event {verb}: {change.event.describe()}")
            try:
                await asyncio.to_thread(change_link, self.network, change.a, change.b,
                                        change.latency_s, change.bandwidth_bps, change.loss)
            except (TestbedError, OSError) as exc:
                self._fail(f"network event {change.event.describe() if change.event else ''}"
                           f" could not be applied: {exc}")
                return
            if change.loss is not None:
                self._down = change.event if change.loss >= 1.0 else None

    async def _serve(self, worker: WorkerHandle) -> None:
        """One worker's messages until it is done."""
        assert worker.reader is not None
        while True:
            try:
                msg = await read_message(worker.reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                await asyncio.sleep(0.5)  # let the process watcher name the exit code
                self._fail(f"worker {worker.describe()} closed its control connection")
                return
            op = msg.get("op")
            if op == "iteration":
                self._on_iteration(worker, msg)
            elif op == "request":
                await self._on_request(worker, msg)
            elif op == "sent":
                await self._on_sent(msg)
            elif op == "bubble":
                await self._on_bubble(worker, msg)
            elif op == "checkpoint" and self.checkpoints is not None:
                done = int(msg["done"])
                if self.checkpoints.part_written(done, worker.gpu):
                    await asyncio.to_thread(self.checkpoints.commit, done, dict(self.losses),
                                            list(self.spans), self.start)
            elif op == "error":
                self.spans.extend(msg.get("spans", []))
                # a peer's death shows up here first; let the watcher name the dead one
                await asyncio.sleep(0.5 if "PeerLost" in str(msg.get("message")) else 0)
                self._fail(
                    f"worker {worker.describe()} failed in iteration "
                    f"{msg.get('iteration')}: {msg.get('message')}"
                )
                return
            elif op == "done":
                worker.finished = True
                return

    async def _serve_decoder(self, decoder: WorkerHandle) -> None:
        """KV caches arriving at a decode server: each one is a request's first token."""
        assert decoder.reader is not None
        while True:
            try:
                msg = await read_message(decoder.reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            if msg.get("op") == "kv" and self.broker is not None:
                self.broker.delivered(int(msg["request"]), float(msg["at"]) - self.start,
                                      int(msg.get("bytes", 0)))

    async def _on_bubble(self, worker: WorkerHandle, msg: dict[str, Any]) -> None:
        """A worker is about to wait: ask the bubble policy for a prefill to run."""
        assert worker.writer is not None
        request = None
        if self.broker is not None and self.job.inference is not None:
            now = time.monotonic() - self.start
            request = self.broker.on_idle(worker.gpu, int(msg["action"]), now,
                                          float(msg["since"]) - self.start)
        if request is None:
            await send_message(worker.writer, {"op": "idle"})
            return
        assert self.job.inference is not None
        gpu = self.topology.gpu(worker.gpu).type
        self._admitted[request.id] = request
        await send_message(worker.writer, {
            "op": "prefill", "request": request.id, "prompt_len": request.prompt_len,
            "modeled_s": modeled_prefill_s(self.job.inference, gpu, request.prompt_len),
            "kv_bytes": kv_bytes(self.job.inference, request.prompt_len)})

    def _learn_bubbles(self, spans: list[dict[str, Any]]) -> None:
        """Measured waits refresh the bubble predictions; measured prefills the time model."""
        if self.broker is None:
            return
        for span in spans:
            if span["kind"] == "recv" and span.get("action") is not None:
                self.broker.record_wait(span["gpu"], int(span["action"]), int(span["iteration"]),
                                        float(span.get("waited", span["end"] - span["start"])))
            elif span["kind"] == "prefill" and span.get("request") in self._admitted:
                self.broker.prefilled(self._admitted[span["request"]],
                                      span["end"] - span["start"])

    def _on_iteration(self, worker: WorkerHandle, msg: dict[str, Any]) -> None:
        iteration = int(msg["iteration"])
        self.spans.extend(msg["spans"])
        if iteration > 0:  # the first iteration warms up
            self.lags.append(float(msg.get("lag_p99_s", 0.0)))
        self._learn_bubbles(msg["spans"])
        if msg.get("loss") is not None:
            self.losses.setdefault(iteration, 0.0)
            self.losses[iteration] += float(msg["loss"]) / self.plan.dp
        seen = self.iterations_seen.setdefault(iteration, set())
        seen.add(worker.gpu)
        self._last_progress = time.monotonic()
        if len(seen) == len(self.workers):
            ends = [
                s["end"] for s in self.spans if s["kind"] == "step" and s["iteration"] == iteration
            ]
            previous = [
                s["end"]
                for s in self.spans
                if s["kind"] == "step" and s["iteration"] == iteration - 1
            ]
            began = max(previous) if previous else self.start
            loss = self.losses.get(iteration)
            self.say(
                f"iteration {iteration + 1}/{self.job.iterations}: "
                f"{(max(ends) - began) / self.dilation:.3f} s"
                + (f", loss {loss:.4f}" if loss else "")
            )

    async def _on_request(self, worker: WorkerHandle, msg: dict[str, Any]) -> None:
        assert self._arbiter is not None
        src_dc, dst_dc = msg["link"].split(">")
        self._transfer_ids += 1
        transfer = Transfer(
            id=self._transfer_ids,
            src_gpu=msg["src"],
            dst_gpu=msg["dst"],
            src_dc=src_dc,
            dst_dc=dst_dc,
            kind=Op(msg["kind"]) if msg["kind"] in Op.__members__ else Op.SEND_F,
            replica=int(msg["replica"]),
            stage=int(msg["stage"]),
            microbatch=int(msg["microbatch"]),
            nbytes=int(msg["bytes"]),
            ready_at=float(msg["ready_at"]) - self.start,
            iteration=int(msg["iteration"]),
        )
        self._pending[msg["tag"]] = transfer
        self._granted_to[msg["tag"]] = worker
        granted = self._arbiter.request(transfer)
        if granted is not None:
            await self._grant(granted)

    async def _grant(self, transfer: Transfer) -> None:
        tag = next(t for t, tr in self._pending.items() if tr is transfer)
        worker = self._granted_to[tag]
        assert worker.writer is not None
        await send_message(worker.writer, {"op": "grant", "tag": tag})

    async def _on_sent(self, msg: dict[str, Any]) -> None:
        assert self._arbiter is not None
        transfer = self._pending.pop(msg["tag"], None)
        self._granted_to.pop(msg["tag"], None)
        if transfer is None:
            return
        granted = self._arbiter.release(transfer)
        if granted is not None:
            await self._grant(granted)

    async def _stall_watch(self) -> None:
        """Ends a run that stopped moving, naming who holds it up; a dead delay line is
        reported as what it is within a second."""
        while True:
            await asyncio.sleep(1.0)
            dead = self._dead_delay_line()
            if dead:
                self._fail(dead)
                return
            if time.monotonic() - self._last_progress > self.stall_timeout_s:
                down = f" (network event: {self._down.describe()})" if self._down else ""
                self._fail(
                    f"no progress for {self.stall_timeout_s / self.dilation:g} s"
                    + (f" (x{self.dilation} dilated)" if self.dilation > 1 else "")
                    + f"; stuck: {self._stuck()}{down}"
                )
                return

    def _stuck(self) -> str:
        """The workers a stall is waiting on: stopped processes first, else those that
        finished the fewest iterations (every worker, when they are level)."""
        stopped = [w for w in self.workers if w.process is not None
                   and process_state(w.process.pid) in ("T", "t")]
        if stopped:
            return ", ".join(f"{w.describe()} is stopped" for w in stopped)
        done = {w.gpu: sum(w.gpu in seen for seen in self.iterations_seen.values())
                for w in self.workers if not w.finished}
        if not done:
            return "no worker (all finished)"
        fewest = min(done.values())
        behind = [w.describe() for w in self.workers if done.get(w.gpu) == fewest]
        first = self.checkpoints.first_iteration if self.checkpoints else 0
        where = f"in iteration {first + fewest + 1}"
        return f"{', '.join(behind[:4])}{' ...' if len(behind) > 4 else ''} ({where})"

    def _dead_delay_line(self) -> str | None:
        if self.network is None:
            return None
        for key, proc in self.network.delay_lines.items():
            code = proc.poll()
            if code is not None:
                return (f"the delay line for WAN link {key} exited with code {code}: the "
                        f"emulated network is broken")
        return None

    async def _teardown(self) -> None:
        for decoder in self.decoders:
            decoder.finished = True  # their exit now is expected
        for worker in [*self.workers, *self.decoders]:
            if worker.writer is not None:  # a worker still training is told to give up
                order = "stop" if worker.finished or worker in self.decoders else "abort"
                with contextlib.suppress(Exception):
                    await send_message(worker.writer, {"op": order})
        deadline = time.monotonic() + STOP_GRACE_S
        for signum in (None, signal.SIGTERM, signal.SIGKILL):
            for worker in [*self.workers, *self.decoders]:
                proc = worker.process
                if proc is not None and proc.returncode is None and signum is not None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signum)
            pending = [
                w.process.wait()
                for w in [*self.workers, *self.decoders]
                if w.process is not None and w.process.returncode is None
            ]
            if not pending:
                break
            timeout = max(0.1, deadline - time.monotonic()) if signum is None else 2.0
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*pending), timeout)
        for worker in [*self.workers, *self.decoders]:
            if worker.writer is not None:
                worker.writer.close()
            if worker.log is not None:
                worker.log.close()
        if getattr(self, "_server", None) is not None:
            self._server.close()
        if self.network is not None:
            problems = await asyncio.to_thread(tear_down, self.network)
            for problem in problems:
                self.say(f"teardown: {problem}")


async def _to_the_end(work: Awaitable[T], keep: Callable[[T], None] | None = None) -> T:
    """Await `work` even if this task is cancelled meanwhile (Ctrl-C or SIGTERM while the
    network comes up or goes down): it must finish, and `keep` see its result, so that
    teardown knows what exists; the cancellation is passed on afterwards."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    result = task.result()
    if keep is not None:
        keep(result)
    if cancelled:
        raise asyncio.CancelledError
    return result


async def run_with_signals(coordinator: Coordinator) -> RunOutcome:
    """Run, turning SIGINT/SIGTERM into an orderly teardown and Interrupted."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    received: list[int] = []

    def on_signal(signum: int) -> None:
        if not received:
            received.append(signum)
            coordinator.say("stopping: tearing down")
            inner.cancel()

    inner = asyncio.ensure_future(coordinator.run())
    handled = []
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(signum, on_signal, signum)
            handled.append(signum)
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        with contextlib.suppress(asyncio.CancelledError, TestbedError):
            await inner
        if received:
            raise Interrupted(received[0]) from None
        raise
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)
