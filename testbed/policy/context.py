"""What a policy may use while it plans besides the topology and the job.

The caller builds it (testbed.experiments.planning wires the simulator in), so a policy
can weigh candidate plans by simulating them without importing the simulator, and keep
results in a cache the caller decides the life of: one command planning several policies shares
one, so variants that re-run a policy's search reuse its simulations. A search's answer
may also be kept across commands (`memo`, on disk where the caller allows it).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, TypeVar

from testbed.common.memo import Memo, NoMemo
from testbed.job.model import Job
from testbed.plan.model import Plan
from testbed.plan.tcp_model import HostLimits
from testbed.policy.parallel import Pool, forked_pool, pool_size

R = TypeVar("R")

Simulator = Callable[[Plan, Job, "float | None"], "float | None"]
"""Seconds per iteration of a plan run for a job, or None when it cannot be simulated;
the third argument is `stop_above` (see `PlanningContext.simulate`)."""


PROGRESS_EVERY_S = 5.0
"""How often a long search's progress is shown: a line at most this often, the first once
the search has taken this long (a quick one says nothing)."""


class SearchProgress:
    """Lines for the user while a policy's search runs: `simulated()` after each candidate
    plan simulated, a line at most every PROGRESS_EVERY_S. Counted in the planning
    process alone: a pool's workers inherit it, and their calls are counted as their
    results come back."""

    def __init__(self, say: Callable[[str], None], what: str) -> None:
        self.say = say
        self.what = what
        self.count = 0
        self.began = self.shown = time.monotonic()
        self._pid = os.getpid()

    def simulated(self) -> None:
        if os.getpid() != self._pid:
            return
        self.count += 1
        now = time.monotonic()
        if now - self.shown >= PROGRESS_EVERY_S:
            self.shown = now
            self.say(f"{self.what}: {self.count} candidate plans simulated, "
                     f"{now - self.began:.0f} s so far")


class PlanningContext:
    """Handed to `TrainingPolicy.plan`. Without a simulator (tests, tools that only need
    a plan), `simulate` answers None, as for a plan that cannot be simulated."""

    def __init__(self, job: Job | None = None, simulator: Simulator | None = None,
                 cache: dict[Any, Any] | None = None,
                 host_limits: HostLimits | None = None, processes: int = 1,
                 memo: Memo | None = None, progress: SearchProgress | None = None) -> None:
        self.job = job
        self.processes = processes
        """How many processes planning may spread simulations over (`pool`)."""
        self.host_limits = host_limits or HostLimits()
        """What each host allows a worker's connections (open files, TCP memory): the
        machine that will run the plan's workers, or Linux's defaults."""
        """The job being planned: what `simulate` runs unless told otherwise."""
        self.cache: dict[Any, Any] = {} if cache is None else cache
        """Results a policy wants to remember; shared by every plan of one command, so
        keys must say everything the value depends on (and whose key it is)."""
        self.memo: Memo = memo or NoMemo()
        """Answers kept across commands on this machine (`put(key, value)`, the value a
        dataclass the codec reads back; `get(key, kind, check)`, None when none is kept,
        or it is not a `kind`, or `check(answer)` rejects it): for a search whose answer
        is a function of its inputs alone. The key must say everything the answer depends
        on, and whose key it is; the store adds the version of testbed's and the policy's
        code (testbed.common.memo)."""
        self._simulator = simulator
        self._progress = progress

    def simulate(self, plan: Plan, job: Job | None = None, stop_above: float | None = None
                 ) -> float | None:
        """Simulated seconds per iteration of `plan` on the topology being planned, run
        for `job` (default: the job being planned; pass one with fewer iterations to
        probe quickly); None when the plan cannot be simulated.

        `stop_above` (seconds): stop the run once its iteration time is sure to exceed
        this (a candidate slower than the best so far needs no more); an answer above
        `stop_above` is then only a lower bound ("at least"). Answers at or below it are
        exact."""
        if self._simulator is None:
            return None
        run = job if job is not None else self.job
        if run is None:
            raise ValueError("simulate needs a job: this context was made without one")
        seconds = self._simulator(plan, run, stop_above)
        if self._progress is not None:
            self._progress.simulated()
        return seconds

    def pool(self, work: Callable[..., R], preload: Callable[[], object] | None = None
             ) -> AbstractContextManager[Pool[R]]:
        """Spread calls of `work` over `processes` processes: inside the block,
        `pool.submit(*args)` starts `work(*args)` and returns a function that waits for
        its result (`pool.size` of them run at once). `work` runs in processes forked when
        the block opens (so it may close over anything, the policy's own state as it is
        then); its arguments and results are pickled. With one process (or where forking
        is unsafe: see testbed.policy.parallel) each call runs at once, here.

        `preload`: a slow import some calls need (a plugin's own): it runs here while the
        first calls run there, and the processes are forked again once it is done and
        none is busy, to inherit it; `work` must therefore not depend on state that
        changes inside the block. Ignored where calls run here."""
        return _counted(forked_pool(work, self.processes, preload), self._progress)

    @property
    def pool_size(self) -> int:
        """How many calls `pool` would run at once, were it opened now."""
        return pool_size(self.processes)


@contextmanager
def _counted(opened: AbstractContextManager[Pool[R]], progress: SearchProgress | None
             ) -> Iterator[Pool[R]]:
    """The pool, its calls counted as simulated plans as their results come back here
    (where they run here, `simulate` counts them)."""
    with opened as pool:
        if progress is None or pool.size == 1:
            yield pool
            return

        def submit(*args: Any) -> Callable[[], R]:
            wait = pool.submit(*args)
            answers: list[R] = []

            def waited() -> R:
                if not answers:
                    answers.append(wait())
                    progress.simulated()
                return answers[0]
            return waited
        yield Pool(submit, pool.size)
