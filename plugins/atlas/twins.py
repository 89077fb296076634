"""Candidates whose plans are one under different schedule names (1F1B with more warm-up
than there are microbatches to keep in flight, or with all of them in warm-up where that
is GPipe's order): Atlas simulates such a plan once where the same run would answer for
each. Pure."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from testbed.policy.api import Job, schedule_actions

from .search import Candidate

Answer = Callable[[], "float | None"]
"""Waits for a simulation's answer: seconds per iteration, or None (it cannot run)."""


def twin(probe: Job, candidate: Candidate) -> tuple[Any, ...] | None:
    """What the candidate's plan depends on, its schedule by what its GPUs do: equal keys
    make equal plans (the same placement, mechanisms and action lists; Candidate.key
    names the schedule instead). None for torch's orders."""
    if candidate.virtual > 1 or candidate.schedule_kind.from_torch:
        return None
    chain, dp, schedule, temporal, cell, multi = candidate.key
    actions = schedule_actions(schedule, candidate.pp, probe.microbatches_for(dp), dp)
    return (chain, dp, temporal, cell, multi, actions)


def once(wait: Answer) -> Answer:
    """`wait`, called once: later calls return its first answer (a twin may ask again)."""
    answers: list[float | None] = []

    def waiting() -> float | None:
        if not answers:
            answers.append(wait())
        return answers[0]
    return waiting


def reused(earlier: tuple[float | None, Answer], stop_above: float | None,
           start: Callable[[], Answer]) -> Answer:
    """Waits for the same plan's earlier answer (`(its stop, its answer)`) and returns it
    where a run told to stop above `stop_above` would give the same (`answers_alike`);
    else starts that run and waits for it."""
    def waiting() -> float | None:
        stopped_above, answer = earlier
        seconds = answer()
        if answers_alike(seconds, stopped_above, stop_above):
            return seconds
        return start()()
    return waiting


def answers_alike(seconds: float | None, stopped_above: float | None,
                  stop_above: float | None) -> bool:
    """Whether a run of a plan told to stop above `stop_above` answers `seconds`, as the
    same plan's run told `stopped_above` did. The simulation is deterministic: the same
    stop, the same answer; an exact time (not above its stop) is the answer of any run
    whose stop it is not above either, since such a run is never sure to be slower and
    runs to its end (testbed.sim.simulate.simulated_iteration_s)."""
    if stop_above == stopped_above:
        return True
    if seconds is None or (stopped_above is not None and seconds > stopped_above):
        return False  # failed, or only a bound: another stop may end elsewhere
    return stop_above is None or seconds <= stop_above
