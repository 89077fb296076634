from __future__ import annotations

from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from testbed.errors import InputError
from testbed.plan import Op, validate_plan
from testbed.plan.describe import allreduce_spans_wan, wan_crossings
from testbed.policy import training_policy
from testbed.policy.api import PlanningContext
from testbed.topology import Topology

from .strategies import job_fitting, topologies

BASELINES = ["gpipe", "1f1b", "dp-across-dc"]


def _plan_or_infeasible(policy: str, topology: Topology, job: Any) -> Any:
    try:
        return training_policy(policy).plan(topology, job, PlanningContext())
    except InputError as exc:
        # only a job that does not fit may be refused, and it says why
        assert "GPUs" in str(exc) or "multiple" in str(exc) or "fits" in str(exc)
        assume(False)


@pytest.mark.parametrize("policy", BASELINES)
@given(data=st.data())
def test_plans_validate_for_any_topology_and_job(policy: str, data: st.DataObject) -> None:
    topology = data.draw(topologies())
    job = data.draw(job_fitting(topology))
    plan = _plan_or_infeasible(policy, topology, job)
    validate_plan(plan, topology)
    for gpu in plan.used_gpus():
        actions = plan.actions[gpu]
        for mb in range(plan.microbatches):
            stage = actions[0].stage
            forward = [a for a in actions if a.op is Op.F and a.microbatch == mb]
            backward = [a for a in actions if a.op is Op.B and a.microbatch == mb]
            assert len(forward) == len(backward) == 1
            assert actions.index(forward[0]) < actions.index(backward[0])
            assert forward[0].stage == stage
    assert sum(plan.layers) == job.model.layers
    assert (
        plan.connections and all(n == 1 for n in plan.connections.values())
    ) or plan.dp * plan.pp == 1


@given(data=st.data())
def test_gpipe_puts_stages_in_file_order(data: st.DataObject) -> None:
    topology = data.draw(topologies(min_dcs=2))
    job = data.draw(job_fitting(topology))
    plan = _plan_or_infeasible("gpipe", topology, job)
    order = [gpu.name for gpu in topology.gpus()]
    leads = [plan.lead_gpu(r, s) for s in range(plan.pp) for r in range(plan.dp)]
    assert [order.index(g) for g in leads] == sorted(order.index(g) for g in leads)


@given(data=st.data())
def test_dp_across_dc_keeps_pipelines_inside_dcs(data: st.DataObject) -> None:
    topology = data.draw(topologies(min_dcs=2))
    job = data.draw(job_fitting(topology))
    plan = _plan_or_infeasible("dp-across-dc", topology, job)
    assert wan_crossings(plan, topology) == 0
    dcs = {topology.dc_of(plan.lead_gpu(r, 0)) for r in range(plan.dp)}
    assert allreduce_spans_wan(plan, topology) == (len(dcs) > 1)
