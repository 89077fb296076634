"""Plans whose iterations differ: collectives in the action text, cycles in the CSV, and
the validator's checks across a cycle (replicas meet, syncs end, replicas do not drift)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import pytest

from testbed.errors import PlanError
from testbed.job.model import Job, ModelShape
from testbed.plan import Action, Op, Plan, parse_plan_csv, plan_to_csv, validate_plan
from testbed.plan.build import Schedule, build_plan
from testbed.plan.collective import Collective, Reduces, Scope, payload_bytes
from testbed.plan.cycles import Iteration, cycled
from testbed.plan.model import OuterOptimizer, SyncOrder
from testbed.topology import load_topology
from tests.conftest import TOPOLOGIES

PAPER = load_topology(TOPOLOGIES / "paper-3dc.yaml")
JOB = Job(model=ModelShape(layers=8, hidden=64, heads=4, seq_len=32, vocab=256), microbatches=4)
DELTAS = Collective(Reduces.DELTAS)


def _per_dc(dcs: int = 3, per_dc: int = 1, pp: int = 2) -> dict[tuple[int, int], tuple[str, ...]]:
    """`per_dc` pipelines of `pp` GPUs inside each of the first `dcs` DCs."""
    placement = {}
    replica = 0
    for dc in PAPER.datacenters[:dcs]:
        hosts = dc.host_names()
        for r in range(per_dc):
            for stage in range(pp):
                placement[(replica, stage)] = (hosts[r * pp + stage],)
            replica += 1
    return placement


def _inner(per_dc: int = 1, gradients: Collective | None = None) -> Plan:
    return build_plan("test", PAPER, JOB, _per_dc(per_dc=per_dc), Schedule.ONE_F_ONE_B,
                      gradients=gradients)


def _at(*actions: tuple[Op, Collective | None]) -> Callable[[int], Sequence[Action]]:
    return lambda stage: [Action(stage, op, None, c) for op, c in actions]


NOTHING = _at()
SYNC = _at((Op.ALLREDUCE, DELTAS), (Op.OUTER_STEP, None))


@pytest.mark.parametrize("text", [
    "0ALLREDUCE", "0ALLREDUCE[delta]", "0ALLREDUCE[delta,f1/4,int4,dc]", "3ALLREDUCE[top1%]",
    "0ALLREDUCE_START[delta,f0/2,int8]", "0ALLREDUCE_WAIT[delta,f0/2,int8]",
    "1OUTER_STEP", "1OUTER_STEP[f3/4]", "0ALLREDUCE[dc]", "2ALLREDUCE[fp32]",
    "0ALLREDUCE_START[b2/8]", "0ALLREDUCE_START[delta,f1/4,fp4,b0/3]", "1ALLREDUCE[fp4]",
])
def test_collective_action_text_round_trip(text: str) -> None:
    assert str(Action.parse(text)) == text


@pytest.mark.parametrize("bad, problem", [
    ("0F1[delta]", "takes nothing in brackets"),
    ("0ALLREDUCE[f2/2]", "does not exist"),
    ("0ALLREDUCE[int3]", "is not grad/delta"),
    ("0ALLREDUCE[delta,grad]", "given twice"),
    ("0OUTER_STEP[int4]", "names only its fragment"),
    ("0ALLREDUCE[top0%]", "is not grad/delta"),
    ("0ALLREDUCE[b3/3]", "bucket 3 of 3 does not exist"),
    ("0OUTER_STEP[b0/2]", "names only its fragment"),
])
def test_bad_collective_actions(bad: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Action.parse(bad)


def test_one_spelling_per_action() -> None:
    assert Action.parse("0ALLREDUCE[grad,all,f0/1]") == Action.parse("0ALLREDUCE")
    assert str(Action.parse("0OUTER_STEP[delta,f0/1]")) == "0OUTER_STEP"


def test_payload_bytes_follow_the_payload() -> None:
    n = 1 << 20
    assert payload_bytes(n, "", 2) == 2 * n
    assert payload_bytes(n, "fp32", 2) == 4 * n
    assert payload_bytes(n, "int8", 2) == n + 4 * n // 256
    assert payload_bytes(n, "int4", 2) == n // 2 + 4 * n // 256
    assert payload_bytes(n, "fp4", 2) == n // 2 + 4 * n // 256
    assert payload_bytes(n, "top1%", 2) == -(-n // 100) * 6


def test_a_cycle_round_trips_through_csv() -> None:
    plan = cycled(_inner(), [NOTHING] * 9 + [SYNC], OuterOptimizer(lr=0.5, mixing=0.25))
    assert plan.period == 10 and plan.cycle == (0,) * 9 + (1,) and len(plan.programs) == 1
    text = plan_to_csv(plan)
    assert "meta,cycle,0x9 1" in text
    assert parse_plan_csv(text) == plan
    validate_plan(plan, PAPER)


def test_an_opening_eager_ordered_plan_round_trips_through_csv() -> None:
    start = _at((Op.ALLREDUCE_START, DELTAS), (Op.OUTER_STEP, None))
    again = _at((Op.ALLREDUCE_WAIT, DELTAS), (Op.ALLREDUCE_START, DELTAS), (Op.OUTER_STEP, None))
    plan = replace(cycled(_inner(), [NOTHING, again], OuterOptimizer(eager=True),
                          opening=[NOTHING, start]), sync_order=SyncOrder.FIRST_LAYERS)
    assert plan.opening == (0, 2) and plan.cycle == (0, 1)
    text = plan_to_csv(plan)
    assert "meta,opening,0 2" in text and "outer,eager,on" in text
    assert "meta,sync_order,first-layers" in text
    assert parse_plan_csv(text) == plan
    validate_plan(plan, PAPER)
    assert [plan.program_of(i) for i in range(6)] == [0, 2, 0, 1, 0, 1]


def test_a_sync_crossing_the_cycle_needs_an_opening_that_agrees() -> None:
    start, wait = _at((Op.ALLREDUCE_START, DELTAS)), _at((Op.ALLREDUCE_WAIT, DELTAS),
                                                         (Op.OUTER_STEP, None))
    both = _at((Op.ALLREDUCE_WAIT, DELTAS), (Op.OUTER_STEP, None),
               (Op.ALLREDUCE_START, DELTAS))
    with pytest.raises(PlanError, match="waits for an all-reduce this stage has not"):
        validate_plan(cycled(_inner(), [NOTHING, both]), PAPER)
    validate_plan(cycled(_inner(), [NOTHING, both], opening=[NOTHING, start]), PAPER)
    other = Collective(Reduces.DELTAS, payload="fp32")
    switch = _at((Op.ALLREDUCE_WAIT, DELTAS), (Op.OUTER_STEP, None),
                 (Op.ALLREDUCE_START, other))
    with pytest.raises(PlanError, match="is never waited for"):  # other's, in the next
        validate_plan(cycled(_inner(), [NOTHING, switch], opening=[NOTHING, start]), PAPER)
    with pytest.raises(PlanError, match="waits for an all-reduce this stage has not"):
        validate_plan(cycled(_inner(), [NOTHING, start], opening=[NOTHING, wait]), PAPER)


def test_an_eager_outer_step_needs_its_fresh_sync_started() -> None:
    eager = OuterOptimizer(eager=True)
    validate_plan(cycled(_inner(), [NOTHING, _at((Op.ALLREDUCE_START, DELTAS),
                                                 (Op.OUTER_STEP, None),
                                                 (Op.ALLREDUCE_WAIT, DELTAS))], eager), PAPER)
    with pytest.raises(PlanError, match=r"eager .OUTER_STEP before this fragment's sync"):
        validate_plan(cycled(_inner(), [NOTHING, SYNC], eager), PAPER)


def test_a_delta_sync_in_the_backward_is_refused_where_gradients_reduce_after_it() -> None:
    plan = cycled(_inner(2, Collective(scope=Scope.DC)), [NOTHING, lambda stage: Iteration(
        in_backward=(Action(stage, Op.ALLREDUCE_START, None, DELTAS),),
        after=(Action(stage, Op.ALLREDUCE_WAIT, None, DELTAS), Action(stage, Op.OUTER_STEP)))])
    with pytest.raises(PlanError, match="starts in the backward, where its parameters take"):
        validate_plan(plan, PAPER)


def test_diloco_every_h_steps_is_valid_and_stepping_apart_without_it_is_not() -> None:
    validate_plan(cycled(_inner(), [NOTHING] * 4 + [SYNC]), PAPER)
    with pytest.raises(PlanError, match="replicas would diverge"):
        validate_plan(cycled(_inner(), [NOTHING] * 5), PAPER)


def test_every_fragment_must_be_synced_once_per_cycle() -> None:
    def fragment(k: int) -> Callable[[int], Sequence[Action]]:
        c = Collective(Reduces.DELTAS, k, 3)
        return _at((Op.ALLREDUCE, c), (Op.OUTER_STEP, c))

    validate_plan(cycled(_inner(), [fragment(0), fragment(1), fragment(2)]), PAPER)
    with pytest.raises(PlanError, match="fragment 2 of 3 is never brought together"):
        validate_plan(cycled(_inner(), [fragment(0), fragment(1), NOTHING]), PAPER)


def test_a_dc_scoped_gradient_reduce_does_not_keep_dcs_together() -> None:
    plan = _inner(per_dc=2, gradients=Collective(scope=Scope.DC))
    with pytest.raises(PlanError, match="replicas would diverge"):
        validate_plan(plan, PAPER)
    validate_plan(cycled(plan, [NOTHING, SYNC]), PAPER)
    with pytest.raises(PlanError, match="needs the topology"):
        validate_plan(cycled(plan, [NOTHING, SYNC]))


def test_an_overlapped_sync_ends_within_the_cycle() -> None:
    c = Collective(Reduces.DELTAS, payload="int4")
    start, wait = _at((Op.ALLREDUCE_START, c)), _at((Op.ALLREDUCE_WAIT, c), (Op.OUTER_STEP, None))
    validate_plan(cycled(_inner(), [NOTHING, start, NOTHING, wait]), PAPER)
    with pytest.raises(PlanError, match="is never waited for"):
        validate_plan(cycled(_inner(), [NOTHING, NOTHING, start]), PAPER)
    with pytest.raises(PlanError, match="has not started"):
        validate_plan(cycled(_inner(), [wait, start]), PAPER)
    with pytest.raises(PlanError, match="already under way"):
        validate_plan(cycled(_inner(), [start, start, wait]), PAPER)


def test_an_outer_step_needs_its_deltas_reduced() -> None:
    with pytest.raises(PlanError, match="OUTER_STEP before an all-reduce of fragment 0"):
        validate_plan(cycled(_inner(), [NOTHING, _at((Op.OUTER_STEP, None))]), PAPER)


def test_replicas_meet_at_the_same_collective() -> None:
    plan = cycled(_inner(), [NOTHING, SYNC])
    program = dict(plan.programs[0])
    west = plan.lead_gpu(2, 0)
    other = Collective(Reduces.DELTAS, payload="int8")
    program[west] = tuple(Action(0, a.op, None, other) if a.op is Op.ALLREDUCE else a
                          for a in program[west])
    with pytest.raises(PlanError, match="must reduce the same collective in the same iteration"):
        validate_plan(Plan(**{**plan.__dict__, "programs": (program,)}), PAPER)


def test_gradients_are_reduced_whole() -> None:
    c = Collective(fragment=0, fragments=2)
    with pytest.raises(PlanError, match="gradients are all-reduced whole"):
        validate_plan(_inner(gradients=c), PAPER)


def test_a_cycle_naming_a_missing_program_is_refused_in_csv() -> None:
    text = plan_to_csv(cycled(_inner(), [NOTHING, SYNC])).replace("meta,cycle,0 1",
                                                                  "meta,cycle,0 2")
    with pytest.raises(Exception, match="names program 2"):
        parse_plan_csv(text)
