"""Work a planner spreads over the machine's cores: processes forked from the planning one,
so that the function they run (a closure over the topology, the job and the policy) needs
no pickling; only its arguments and results cross. Where forking is not safe or not worth
it (one core, a process that already runs other threads, a pool already open) each call
runs at once, in this process: the same results, one after another."""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import multiprocessing.pool
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from testbed.common.heap import old_objects_frozen

R = TypeVar("R")

Waiter = Callable[[], R]
"""Waits for one call's result and returns it (raises what the call raised)."""
Submit = Callable[..., Waiter[R]]
"""Starts one call with these arguments."""

@dataclass(frozen=True)
class Pool(Generic[R]):
    submit: Submit[R]
    size: int
    """Calls under way at once: the processes, or 1 where each runs at once."""


_work: Callable[..., Any] | None = None
"""The open pool's function, as its forked workers inherit it."""


_closing: Any = None
"""The open pool's closing flag (a multiprocessing Event), as its forked workers inherit
it: set, a queued call returns at once."""
_sharing: int | None = None
"""Set in one of several worker processes that share the cores (share_cores): how many."""


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def planning_processes() -> int:
    """How many processes planning may spread over: every core this process may run on,
    or its share of them where it is one of several workers (share_cores)."""
    return max(1, cores() // _sharing) if _sharing else cores()


def share_cores(workers: int) -> None:
    """This process is one of `workers` sharing the machine's cores, each running work of
    its own (a sweep's local workers): planning takes its share of the cores, not all of
    them (the others are busy; more processes would only take turns)."""
    global _sharing
    _sharing = workers


class ForkSafeThread(threading.Thread):
    """A thread a fork may find running: it holds nothing a forked worker could need while
    the fork is under way (testbed.cli.progress's status lines: they are written under a
    lock that forking holds). Planning forks beside it, as beside no thread."""


def pool_size(processes: int) -> int:
    """How many calls a pool of `processes` opened now runs at once (`Pool.size`)."""
    if processes <= 1 or _work is not None or _other_threads():
        return 1
    return processes


def _other_threads() -> bool:
    """Whether another thread runs that a fork could catch holding a lock."""
    here = threading.current_thread()
    return any(thread is not here and not isinstance(thread, ForkSafeThread)
               for thread in threading.enumerate())


@contextmanager
def forked_pool(work: Callable[..., R], processes: int,
                preload: Callable[[], object] | None = None) -> Iterator[Pool[R]]:
    """`submit(*args)` starts `work(*args)` in one of `processes` forked workers. With
    `preload` (an import the work will need, seconds long), see `_Workers`."""
    global _work
    if pool_size(processes) == 1:
        yield Pool(_at_once(work), 1)
        return
    _work = work
    workers = _Workers(processes, preload)
    try:
        yield Pool(workers.submit, processes)
    finally:
        workers.close()
        _work = None


class _Workers:
    """The forked workers. A `preload` runs in a thread of this process while they start
    on the first calls, using what the cores leave idle (this process mostly waits for
    results), instead of before the fork while the other cores wait; once it is done,
    and no call is under way, the workers are forked again and inherit what it loaded.
    A call that needs it before then loads it itself: the same results either way."""

    def __init__(self, processes: int, preload: Callable[[], object] | None) -> None:
        global _closing
        self.processes = processes
        self.closing = _closing = multiprocessing.get_context("fork").Event()
        self.pool = self._fork()
        self.under_way: list[multiprocessing.pool.AsyncResult[Any]] = []
        self.loading: threading.Thread | None = None
        if preload is not None:
            self.loading = threading.Thread(target=_quietly, args=(preload,), daemon=True,
                                            name="testbed-preload")
            self.loading.start()

    def _fork(self) -> multiprocessing.pool.Pool:
        return multiprocessing.get_context("fork").Pool(self.processes, _worker_start,
                                                        (os.getpid(),))

    def submit(self, *args: Any) -> Waiter[Any]:
        self.under_way = [r for r in self.under_way if not r.ready()]
        if self.loading is not None and not self.loading.is_alive() and not self.under_way:
            self.loading.join()
            self.loading = None
            self._stop()
            self.pool = self._fork()
        result = self.pool.apply_async(_call, args)
        self.under_way.append(result)
        return result.get

    def _stop(self) -> None:
        self.pool.terminate()
        self.pool.join()

    def close(self) -> None:
        """Stops the workers, whether the planner is done, failed or was interrupted: the
        calls still queued (started ahead, never awaited) return at once, those running
        finish (one per process), and the workers exit on their own. They are not killed:
        a worker killed while it writes a result holds the results queue's lock for good,
        and the pool's own shutdown (Pool.terminate's too) then waits on it forever. Then
        waits for a preload still running (no thread is left behind: a later pool forks
        only where this process runs no other thread)."""
        self.closing.set()
        self.pool.close()
        self.pool.join()
        if self.loading is not None:
            self.loading.join()


def _quietly(preload: Callable[[], object]) -> None:
    """A preload that fails is left to the call that needs what it loads, to fail there."""
    with contextlib.suppress(BaseException):
        preload()


PR_SET_PDEATHSIG = 1


def _worker_start(parent: int) -> None:
    """A worker leaves Ctrl-C (which reaches the terminal's whole process group) to the
    planning process, dies at once when that process stops the pool, whatever handlers
    it inherited, and dies with it however it dies: no traceback of its own on the
    terminal, nothing left running."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    die_with(parent)


def die_with(parent: int) -> None:
    """This process is SIGKILLed when `parent`, the process that started it, exits
    (PR_SET_PDEATHSIG); if that has happened already (this one is adopted by another,
    before or while the line below ran), it exits now."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(0)


def _call(*args: Any) -> Any:
    assert _work is not None  # set before the workers were forked
    if _closing is not None and _closing.is_set():
        return None  # the pool is closing: nobody waits for this call
    with old_objects_frozen():  # what the worker inherited, and its earlier calls' results
        return _work(*args)


def _at_once(work: Callable[..., R]) -> Submit[R]:
    def submit(*args: Any) -> Waiter[R]:
        result = work(*args)
        return lambda: result
    return submit
