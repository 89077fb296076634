"""Planning with the simulator at the policy's disposal: every command that asks a policy
for its plan comes through here, so policies never import the simulator themselves. It
uses the simulator, so it lives above it; what plans again below the simulator (a
replan after a failure, testbed.run.segments; a launch's rank order) is handed
`plan_with_simulator` as its testbed.policy.registry.Planner.

The cache a policy sees lives as long as `shared_cache` is open (the whole command, for
the CLI), or one plan without it: a command that plans several policies (compare,
sweep, repeats) then simulates each candidate once, whichever policy asks. Answers a
policy keeps across commands go to the user's store (testbed.common.memo) inside
`keeping_answers`, as the CLI's commands run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from testbed.common.memo import NoMemo, user_memo
from testbed.errors import TestbedError
from testbed.job.model import Job
from testbed.plan.host_limits import this_machine
from testbed.plan.model import Plan
from testbed.policy.base import TrainingPolicy
from testbed.policy.context import PlanningContext, SearchProgress
from testbed.policy.parallel import planning_processes
from testbed.policy.registry import make_plan
from testbed.sim.simulate import simulated_iteration_s
from testbed.topology.model import Topology

_SHARED: ContextVar[dict[Any, Any] | None] = ContextVar("planning_cache", default=None)
_KEEPING: ContextVar[bool] = ContextVar("planning_memo", default=False)


@contextmanager
def keeping_answers() -> Iterator[None]:
    """Plans made inside may read and keep answers in the user's store across commands
    (testbed.common.memo; the CLI's commands run inside; elsewhere nothing is kept unless
    asked for here)."""
    token = _KEEPING.set(True)
    try:
        yield
    finally:
        _KEEPING.reset(token)


def keeps_answers() -> bool:
    """Whether plans made here may keep answers (inside `keeping_answers`): what a command
    hands to the processes it spreads its runs over."""
    return _KEEPING.get()


@contextmanager
def shared_cache(fresh: bool = False, cache: dict[Any, Any] | None = None
                 ) -> Iterator[dict[Any, Any]]:
    """One cache for every plan made inside; an enclosing one is reused, not replaced,
    unless `fresh` (a sweep's point plans with a cache of its own, so that it plans the
    same whichever process runs it, after whichever points). `cache`: this one, where
    none encloses (a caller that plans the same inputs again, later, in this process)."""
    outer = _SHARED.get()
    if outer is not None and not fresh:
        yield outer
        return
    cache = {} if cache is None else cache
    token = _SHARED.set(cache)
    try:
        yield cache
    finally:
        _SHARED.reset(token)


def planning_context(topology: Topology, job: Job, policy: TrainingPolicy,
                     cache: dict[Any, Any] | None = None,
                     say: Callable[[str], None] | None = None) -> PlanningContext:
    """A context whose `simulate` runs the simulator on this topology, arbitrated by
    `policy` (its `next_transfer`), as a run of the plan would be; `say`: where a long
    search's progress goes (SearchProgress)."""

    def simulate(plan: Plan, run: Job, stop_above: float | None) -> float | None:
        try:
            return simulated_iteration_s(topology, run, plan, policy, stop_above)
        except TestbedError:
            return None

    if cache is None:
        cache = _SHARED.get()
    memo = user_memo([type(policy).__module__]) if keeps_answers() else NoMemo()
    progress = None if say is None else SearchProgress(say, f"planning with {policy.name}")
    return PlanningContext(job, simulate, cache, this_machine(), planning_processes(), memo,
                           progress)


def plan_with_simulator(policy: TrainingPolicy, topology: Topology, job: Job,
                        cache: dict[Any, Any] | None = None,
                        say: Callable[[str], None] | None = None) -> Plan:
    """The policy's validated plan (testbed.policy.registry.make_plan), made with the
    simulator available; `cache` defaults to the open shared one, else a fresh one;
    `say`: where a long search's progress goes."""
    return make_plan(policy, topology, job,
                     planning_context(topology, job, policy, cache, say))
