"""The policy of a run that is given its plan (`--plan FILE`, or a Plan through the Python
API) instead of asking a policy for one. The policy then makes no plan: it labels the run
and answers the plan's hooks (which transfer gets an arbitrated WAN link next). By default
it is the policy the plan records, when that one is installed; otherwise `plan-file`,
which grants links first come first served, as the base policy does."""

from __future__ import annotations

from testbed.errors import InputError
from testbed.job.model import Job
from testbed.plan.model import Plan
from testbed.policy.base import TrainingPolicy
from testbed.policy.context import PlanningContext
from testbed.topology.model import Topology

PLAN_FILE = "plan-file"


class GivenPlanHooks(TrainingPolicy):
    """The hooks of a given plan whose own policy is not installed (torch's CSV form
    records `torch-csv`; a hand-written plan whatever its author wrote)."""

    name = PLAN_FILE
    summary = "a given plan (--plan FILE), arbitrated links first come first served"

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        raise InputError("runs a given plan and makes none: give --plan FILE",
                         f"-p {PLAN_FILE}")
