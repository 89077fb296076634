"""The run's processes: one worker per GPU (and decode servers), started on their hosts,
watched for an early exit, and stopped in order (ask, SIGTERM, SIGKILL)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from testbed.common.fsutil import open_fresh, own_directory
from testbed.emulator.net.state import process_state
from testbed.emulator.runtime.coordinator.exits import (
    SAMPLE_S,
    exit_reason,
    oom_kills,
    peak_resident_bytes,
    resident_bytes,
)
from testbed.emulator.runtime.coordinator.hosts import Hosts
from testbed.emulator.runtime.wire.messages import Abort, Message, Stop, send
from testbed.emulator.runtime.wire.protocol import TOKEN_ENV
from testbed.plan.model import Plan

STOP_GRACE_S = 5.0
"""How long workers get to exit on their own before SIGTERM."""


@dataclass
class WorkerHandle:
    index: int
    gpu: str
    replica: int
    stage: int
    """Its first stage."""
    stages: tuple[int, ...] = ()
    """Every stage it holds, when several (virtual stages)."""
    decoder: bool = False
    """A decode server (its `gpu` is the server's host name)."""
    machine: str | None = None
    """The cluster machine it runs on, in a run across machines."""
    launcher: bool = False
    """Not a worker: the torchrun that starts this machine's workers."""
    process: asyncio.subprocess.Process | None = None
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    port: int = 0
    pid: int = 0
    """As the process said in its hello."""
    log: TextIO | None = None
    log_path: Path | None = None
    finished: bool = False
    peak_bytes: int | None = None
    """The most memory its process has held resident, as last read (VmHWM)."""

    def describe(self) -> str:
        where = f" on machine {self.machine}" if self.machine else ""
        if self.launcher:
            return f"torchrun{where}"
        if self.decoder:
            return f"decode server {self.gpu}{where}"
        held = f"stages {', '.join(map(str, self.stages))}" if len(self.stages) > 1 else \
            f"stage {self.stage}"
        return f"{self.gpu} (replica {self.replica}, {held}){where}"

    def last_log_line(self) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln]
        return lines[-1] if lines else ""

    async def tell(self, message: Message) -> None:
        assert self.writer is not None, f"{self.gpu} has no control connection"
        await send(self.writer, message)


@dataclass
class WorkerPool:
    hosts: Hosts
    log_dir: Path
    token: str
    on_exit: Callable[[str], None]
    """Told why, when a process exits before it finished its work."""
    machine: str | None = None
    """This machine's name, in a run across machines."""
    workers: list[WorkerHandle] = field(default_factory=list)
    decoders: list[WorkerHandle] = field(default_factory=list)
    launchers: list[WorkerHandle] = field(default_factory=list)
    """In a run across machines: this machine's torchrun (the workers are its children)."""
    _watchers: list[asyncio.Task[None]] = field(default_factory=list)

    def plan_workers(self, plan: Plan, decode_dcs: tuple[str, ...]) -> None:
        """One worker per GPU, whatever stages it holds."""
        for index, gpu in enumerate(plan.used_gpus()):
            replica, stage = plan.worker_of(gpu)
            self.workers.append(WorkerHandle(index, gpu, replica, stage, plan.stages_of(gpu)))
        for dc in decode_dcs:
            self.decoders.append(WorkerHandle(-1, f"{dc}-decode", -1, -1, decoder=True))

    @property
    def everyone(self) -> list[WorkerHandle]:
        return [*self.workers, *self.decoders, *self.launchers]

    async def launch(self, machine: str, argv: list[str], netns: str | None) -> None:
        """Start this machine's torchrun; its exit before the run ends fails the run."""
        own_directory(self.log_dir.parent, self.log_dir.name)
        handle = WorkerHandle(-1, f"torchrun-{machine}", -1, -1, machine=machine,
                              launcher=True)
        handle.log_path = self.log_dir / f"torchrun-{machine}.log"
        handle.log = open_fresh(handle.log_path)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        env.pop(TOKEN_ENV, None)
        handle.process = await self.hosts.launch(argv, netns, env, handle.log, handle.gpu)
        self.launchers.append(handle)
        self._watchers.append(asyncio.create_task(self._watch(handle)))

    async def start(self, socket_path: Path) -> None:
        own_directory(self.log_dir.parent, self.log_dir.name)
        for handle in self.everyone:
            await self._spawn(handle, socket_path)

    async def _spawn(self, handle: WorkerHandle, socket_path: Path) -> None:
        handle.log_path = self.log_dir / f"{handle.gpu}.log"
        handle.log = open_fresh(handle.log_path)
        env = {**os.environ, TOKEN_ENV: self.token, "PYTHONUNBUFFERED": "1",
               "OMP_NUM_THREADS": "1"}
        if handle.decoder:
            module = "testbed.emulator.runtime.worker.decode"
            args = ["--control", str(socket_path), "--name", handle.gpu,
                    "--address", self.hosts.address_of(handle.gpu)]
        else:
            module = "testbed.emulator.runtime.worker.process"
            args = ["--control", str(socket_path), "--gpu", handle.gpu]
        handle.process = await self.hosts.spawn(handle.gpu, module, args, env, handle.log,
                                                f"worker:{handle.gpu}")
        self._watchers.append(asyncio.create_task(self._watch(handle)))

    async def _watch(self, handle: WorkerHandle) -> None:
        """Wait for the process, reading its size as it runs
        (testbed.emulator.runtime.coordinator.exits)."""
        process = handle.process
        assert process is not None
        oom_before, resident = oom_kills(), None
        exited = asyncio.ensure_future(process.wait())
        try:
            while not (await asyncio.wait({exited}, timeout=SAMPLE_S))[0]:
                resident = resident_bytes(process.pid) or resident
                handle.peak_bytes = peak_resident_bytes(process.pid) or handle.peak_bytes
        finally:
            exited.cancel()  # stopped watching (the run is ending): no task left behind
        if not handle.finished:
            detail = handle.last_log_line()
            who = handle.describe() if handle.launcher else f"worker {handle.describe()}"
            why = exit_reason(exited.result(), oom_before, oom_kills(), resident)
            self.on_exit(f"{who} {why}" + (f": {detail}" if detail else ""))

    def peak_memory(self) -> dict[str, int]:
        """Each worker's peak resident memory on this machine, read now for those alive
        (their high-water mark holds the whole run so far)."""
        peaks = {}
        for worker in self.workers:
            if worker.process is not None:
                now = peak_resident_bytes(worker.process.pid)
                worker.peak_bytes = max(now or 0, worker.peak_bytes or 0) or None
            if worker.peak_bytes:
                peaks[worker.gpu] = worker.peak_bytes
        return peaks

    def pids(self) -> list[int]:
        """This machine's worker processes (their own or, joined by torchrun, as they
        said in their hello)."""
        return [w.process.pid if w.process is not None else w.pid for w in self.workers
                if w.process is not None or (w.pid and w.machine == self.machine)]

    async def stop(self) -> None:
        """Every process gone: told to stop (or abort, if still training), then signalled;
        those the grace would only wait out are signalled at once (`_past_grace`)."""
        for handle in [*self.decoders, *self.launchers]:
            handle.finished = True  # their exit now is expected
        for handle in self.everyone:
            if handle.writer is not None:  # a worker still training is told to give up
                order = Stop() if handle.finished else Abort()
                with contextlib.suppress(Exception):
                    await handle.tell(order)
        for process, now in self._past_grace():
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(now)
        deadline = asyncio.get_running_loop().time() + STOP_GRACE_S
        for signum in (None, signal.SIGTERM, signal.SIGKILL):
            running = [h.process for h in self.everyone
                       if h.process is not None and h.process.returncode is None]
            if not running:
                break
            for process in running:
                if signum is not None:
                    with contextlib.suppress(ProcessLookupError):
                        process.send_signal(signum)
            timeout = (max(0.1, deadline - asyncio.get_running_loop().time())
                       if signum is None else 2.0)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*(p.wait() for p in running)), timeout)
        for watcher in self._watchers:
            watcher.cancel()
        for handle in self.everyone:
            if handle.writer is not None:
                handle.writer.close()
            if handle.log is not None:
                handle.log.close()

    def _past_grace(self) -> list[tuple[asyncio.subprocess.Process, signal.Signals]]:
        """What no grace would end: a stopped process (SIGSTOP), which heeds neither an
        order nor SIGTERM, is killed; a torchrun none of whose workers joined (still at
        its rendezvous: no order reaches it, and only its workers' end would end it) is
        sent SIGTERM."""
        told = {h.machine for h in self.everyone if h.writer is not None}
        signals = []
        for handle in self.everyone:
            process = handle.process
            if process is None or process.returncode is not None:
                continue
            if process_state(process.pid) in ("T", "t"):
                signals.append((process, signal.SIGKILL))
            elif handle.launcher and handle.machine not in told:
                signals.append((process, signal.SIGTERM))
        return signals
