"""What a run's summary divides by, the same whichever backend ran the plan: the tokens
one iteration trains, and the WAN capacity of the links the plan shares. Pure."""

from __future__ import annotations

from testbed.job.model import Job
from testbed.plan.model import Plan
from testbed.topology.model import Topology


def tokens_per_iteration(job: Job, plan: Plan) -> int:
    return plan.dp * plan.microbatches * plan.microbatch_size * job.model.seq_len


def wan_capacity_bps(topology: Topology, plan: Plan) -> float:
    return sum(topology.bottleneck_bps(a, b) for a, b in plan.sharing)
