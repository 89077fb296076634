"""Running a sweep's points: in this process, in local worker processes, or as tasks on a
Ray cluster. A point is the unit of work and plans with a cache of its own, so its rows
are the same whichever process runs it, after whichever points; where the sweep keeps
planning answers across commands, its workers do too (a kept answer is the one the search
would give).

Local workers are spawned (not forked: nothing of this process, its held directory
among it, passes to them), ignore Ctrl-C (this process stops them; they start with it
held, so one that lands while they load is never a traceback of theirs) and die with
this process, however it dies (PR_SET_PDEATHSIG; one that finds this process gone by
the time it sets that exits). What a sweep starts carries its mark, and a local Ray
instance's folder too, so `testbed down` finds what a killed one left
(testbed.emulator.net.sweep_leftovers). Ray is an optional extra (`pip install
'geo-testbed[ray]'`); on a cluster, every node needs this testbed installed.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import shutil
import signal
import socket
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed import DISTRIBUTION
from testbed.common.units import human_bytes, plural
from testbed.emulator.net.sweep_leftovers import marking, ray_folder
from testbed.errors import InputError, TestbedError, TestbedWarning, one_line
from testbed.experiments.planning import keeping_answers, keeps_answers, shared_cache
from testbed.experiments.run import simulated
from testbed.experiments.sweep import Point, Row, row_metrics
from testbed.plan.host_limits import available_memory
from testbed.policy.parallel import cores, die_with, share_cores

Done = Callable[[int, list[Row]], None]
"""Called in this process as each point finishes: its index and rows."""
LOCAL_RAY = "local"
PROBE_S = 10.0
"""How long a cluster's address has to answer."""
WORKER_BYTES = 500 * 10**6
"""What one local worker may hold: 350 MB at its peak planning paper-3dc's points with
Atlas (VmHWM of `sweep topologies/paper-3dc.yaml -p atlas --workers 2`), with a margin."""


def local_workers(wanted: int) -> tuple[int, str | None]:
    """How many points run at once on this machine: `wanted`, but one per core at most
    (more only take turns) and as many as its available memory holds; with why, when
    fewer."""
    memory = available_memory()
    by_memory = max(1, memory // WORKER_BYTES) if memory is not None else wanted
    count = min(wanted, cores(), by_memory)
    if count == wanted:
        return count, None
    why = (f"this machine's {plural(cores(), 'core')}" if count == cores() else
           f"what its {human_bytes(memory or 0)} of available memory holds at "
           f"{human_bytes(WORKER_BYTES)} a worker")
    return count, f"{wanted:,} asked for, {count} run at once: {why}"


@dataclass(frozen=True)
class PointRows:
    """A point's rows, one per run, and what its runs warned of, in order (for the
    sweep's own process to say; never written to sweep.csv)."""

    rows: list[Row]
    warnings: list[str]


Finished = Callable[[int, PointRows], None]
"""Called in this process as a worker hands a point back."""


def run_point(point: Point, keep: bool = False) -> PointRows:
    """The point's rows, one per run; a run that fails is a row with its error. `keep`:
    plans may keep answers in the user's store, as the sweep's own process does
    (testbed.experiments.planning.keeping_answers): its workers share their searches."""
    rows: list[Row] = []
    warned: list[str] = []
    kept = keeping_answers() if keep else contextlib.nullcontext()
    with shared_cache(fresh=True), kept:  # ablations reuse their parent's search, in a point
        for run in point.runs:
            row: Row = {**dict(point.values), **run.labels}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", TestbedWarning)
                try:
                    record = simulated(run.spec)
                    row.update(row_metrics(record.typed()))
                    row["error"] = one_line(record.error) if record.error else ""
                except TestbedError as exc:
                    row["error"] = one_line(str(exc))
            for warning in caught:
                if issubclass(warning.category, TestbedWarning):
                    warned.append(str(warning.message))
                else:
                    warnings.warn_explicit(warning.message, warning.category,
                                           warning.filename, warning.lineno)
            rows.append(row)
    return PointRows(rows, warned)


def said(done: Done) -> Finished:
    """`done`, after saying in this process what each run warned of (once for the same
    words: Python's warning filter), wherever the point ran."""
    def relay(index: int, point: PointRows) -> None:
        for message in point.warnings:
            warnings.warn(message, TestbedWarning, stacklevel=1)
        done(index, point.rows)

    return relay


Runner = Callable[[Sequence[Point], Done], None]


@contextlib.contextmanager
def runner(workers: int = 1, ray: str | None = None) -> Iterator[Runner]:
    """What runs points, `workers` at a time (on `ray`: a cluster's address, or "local"
    for a Ray instance of `workers` CPUs on this machine), ready before a sweep makes
    anything: an unreachable cluster is refused first."""
    if ray is None:
        with marking():
            yield lambda points, done: _locally(points, said(done), workers)
        return
    check_ray_address(ray)
    module = _ray()
    temp = ray_folder() if ray == LOCAL_RAY else None
    try:
        with marking(temp):
            _connect(module, ray, workers, temp)
            yield lambda points, done: _ray_tasks(module, points, said(done))
    finally:
        module.shutdown()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)


def _locally(points: Sequence[Point], done: Finished, workers: int) -> None:
    if workers <= 1 or len(points) <= 1:
        for point in points:
            done(point.index, run_point(point))
    else:
        _on_processes(points, done, workers)


def _worker_start(workers: int, sweep: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the sweep, which stops us
    die_with(sweep)  # a killed sweep takes us along
    share_cores(workers)  # the other workers plan and simulate on the other cores


def _on_processes(points: Sequence[Point], done: Finished, workers: int) -> None:
    count = min(workers, len(points))
    executor = ProcessPoolExecutor(count, multiprocessing.get_context("spawn"), _worker_start,
                                   (count, os.getpid()))
    try:
        with _held(signal.SIGINT):  # the workers start (on the first submits) with it held
            pending: dict[Future[PointRows], int] = {
                executor.submit(run_point, point, keeps_answers()): point.index
                for point in points}
        while pending:
            finished, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                done(pending.pop(future), future.result())
    except BrokenProcessPool:
        _stop(executor)
        raise TestbedError("a sweep worker process died (killed, or out of memory?); the "
                           "points done are kept: run the same sweep again to go on") from None
    except BaseException:
        _stop(executor)
        raise
    executor.shutdown()


@contextlib.contextmanager
def _held(signum: int) -> Iterator[None]:
    """`signum` held off while the block runs, to land once it ends: blocked in this
    thread, and so in the processes and threads it starts meanwhile, which inherit that;
    and where it reaches this process through another thread, noted and raised here
    afterwards (Python runs handlers in the main thread, whichever thread took the
    signal: it would land in the middle of starting a worker)."""
    caught: list[int] = []
    try:
        previous = signal.signal(signum, lambda got, _frame: caught.append(got))
        ours = True
    except ValueError:  # not the main thread, where Python's handlers never run
        previous, ours = None, False
    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum})
        if ours:
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
            if caught:
                signal.raise_signal(signum)


def _stop(executor: ProcessPoolExecutor) -> None:
    """Stop the workers now, their points unfinished (3.11 has no public way: 3.14's
    terminate_workers does this)."""
    processes = list((executor._processes or {}).values())
    executor.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.kill()
    for process in processes:
        process.join()


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise InputError(f"needs Ray, an optional extra: pip install '{DISTRIBUTION}[ray]'",
                         "--ray") from None
    return ray


def _connect(ray: Any, address: str, workers: int, temp: Path | None) -> None:
    if temp is None and address != "auto":
        _reachable(address)
    try:
        if temp is not None:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
                     logging_level=logging.ERROR, _temp_dir=str(temp))
        else:
            ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise InputError(f"cannot start or reach Ray at {address!r}: {one_line(str(exc))}",
                         "--ray") from None


RAY_ADDRESS = "HOST:PORT (a port from 1 to 65535), ray://HOST:PORT, auto or local"
CLIENT = "ray://"
HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")
"""What a gRPC client sends first (a cluster's GCS and Ray Client server are gRPC): the
HTTP/2 preface and an empty SETTINGS frame; a gRPC server answers with a SETTINGS frame."""


def check_ray_address(address: str) -> None:
    """`--ray` as Ray takes it, or a one-line error before Ray sees it (`127.0.0.1:-5` had
    Ray retry for ever, `:` print its traceback)."""
    if address in (LOCAL_RAY, "auto"):
        return
    host, sep, port = address.removeprefix(CLIENT).rpartition(":")
    if not (sep and host and port.isascii() and port.isdigit() and 1 <= int(port) <= 65535
            and not any(c.isspace() or c in "/@" for c in host)):
        raise InputError(f"expected {RAY_ADDRESS}, got {address!r}", "--ray")


def _reachable(address: str) -> None:
    """A cluster's HOST:PORT answers as a Ray cluster does (gRPC) within PROBE_S, or a
    one-line error now: Ray itself retries for minutes, whatever answers there."""
    host, _, port = address.removeprefix(CLIENT).rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=PROBE_S) as sock:
            sock.sendall(HTTP2_PREFACE)
            answer = b""
            while len(answer) < 9:
                got = sock.recv(9 - len(answer))
                if not got:
                    break
                answer += got
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else exc.strerror or str(exc)
        raise InputError(f"no Ray cluster answers at {address!r}: {why}", "--ray") from None
    if len(answer) < 9 or answer[3] != 4:  # an HTTP/2 frame header: its type, SETTINGS
        raise InputError(f"what answers at {address!r} is not a Ray cluster (it does not "
                         "speak gRPC)", "--ray")


def _ray_tasks(ray: Any, points: Sequence[Point], done: Finished) -> None:
    task = ray.remote(num_cpus=1, max_retries=0)(run_point)
    pending = {task.remote(point, keeps_answers()): point.index for point in points}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                try:
                    handed: PointRows = ray.get(ref)
                except ray.exceptions.RayError as exc:
                    raise TestbedError(f"a sweep task failed on Ray: {one_line(str(exc))}; "
                                       "the points done are kept: run the same sweep again "
                                       "to go on") from None
                done(pending.pop(ref), handed)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
