"""Bubbles predicted from the plan: until waits have been measured the broker also uses the
simulator's model of them, so the first iteration is filled too, and the second is not
planned on the first's waits alone (testbed.inference.bubbles.BubbleBroker.modeled_waits)."""

from __future__ import annotations

from dataclasses import replace

from testbed.errors import TestbedError
from testbed.inference.workload import WaitKey, predicted_bubbles
from testbed.job.model import Job
from testbed.plan.model import Plan
from testbed.plan.profile import Profile
from testbed.policy.base import TrainingPolicy
from testbed.sim.simulate import simulate_plan
from testbed.topology.model import Topology


def modeled_waits(topology: Topology, job: Job, plan: Plan, policy: TrainingPolicy,
                  profile: Profile | None = None, scale: float = 1.0
                  ) -> dict[WaitKey, float]:
    """Each GPU's wait at each receive and all-reduce of each program, the shorter of the
    first two iterations that run it (two cycles of the plan) as the simulator models
    them without bubble filling; times `scale` (a dilation). Empty when the plan cannot
    be simulated (the broker then waits for measurements)."""
    try:
        _, spans = simulate_plan(topology, replace(job, iterations=2 * plan.period), plan,
                                 policy, profile)
    except TestbedError:
        return {}
    return {key: wait * scale
            for key, wait in predicted_bubbles(spans, 2, plan.program_of).items()}
