"""Plans with several stages per GPU, split backwards and overlapped units: what the
validator refuses, what the interpreter tells a backend, the activations a GPU holds, the
memory check, the summary and grid, and that both backends run them."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from testbed.emulator.backend import EmulatorBackend
from testbed.errors import InputError, PlanError
from testbed.experiments.planning import plan_with_simulator
from testbed.job.load import parse_job
from testbed.plan import Action, Op, Plan, plan_grid, plan_to_csv, validate_plan
from testbed.plan.activations import in_flight, peak_layers_held
from testbed.plan.build import (
    Schedule,
    build_plan,
    check_memory,
    file_order_placement,
    virtual_placement,
)
from testbed.plan.collective import Collective, Reduces
from testbed.plan.compute import gpu_memory_bytes, stage_params
from testbed.plan.cycles import cycled
from testbed.plan.ideal import ideal_bubble_fraction
from testbed.plan.interpret import Compute, Overlapped, Part, Phase, Receive, Send, SendWait
from testbed.plan.interpret import interpret as interpret_steps
from testbed.plan.model import Feature
from testbed.run.spec import RunSpec
from testbed.sim.backend import SimulatorBackend, SimulatorPrediction
from testbed.topology import parse_topology
from tests.test_cli import call

TOPOLOGY = parse_topology(
    {
        "datacenters": [{"name": "east", "gpus": 4}, {"name": "west", "gpus": 4}],
        "wan": [{"between": ["east", "west"], "latency": "20ms", "bandwidth": "1Gbit"}],
    },
    "two.yaml",
)
TINY = parse_job({"model": "tiny", "microbatches": 4})
JOB = replace(TINY, model=replace(TINY.model, layers=8))
PAPER = str(Path(__file__).resolve().parent.parent / "topologies" / "paper-3dc.yaml")


def _plan(schedule: Schedule, dp: int = 1, ranks: int = 2, virtual: int = 2,
          **kwargs: object) -> Plan:
    placement = virtual_placement(file_order_placement(TOPOLOGY, dp, ranks, 1), schedule,
                                  virtual)
    return build_plan(schedule.value, TOPOLOGY, JOB, placement, schedule, **kwargs)  # type: ignore[arg-type]


def _with(plan: Plan, gpu: str, actions: list[str]) -> Plan:
    return replace(plan, actions={**plan.actions, gpu: tuple(map(Action.parse, actions))})


def _one_gpu(actions: list[str], stages: int = 2) -> Plan:
    """One GPU holding every stage: all messages local."""
    return Plan("hand", 1, stages, 1, 1, (1,) * stages,
                {(0, s): ("east-0",) for s in range(stages)},
                {"east-0": tuple(map(Action.parse, actions))}, {}, {})


SPLIT = ["0F0", "0SEND_F0", "1RECV_F0", "1F0", "1I0", "1SEND_B0", "0RECV_B0", "0I0", "1W0",
         "0W0", "0STEP", "1STEP"]


def test_a_gpu_runs_two_stages_with_split_backwards() -> None:
    validate_plan(_one_gpu(SPLIT), TOPOLOGY)


@pytest.mark.parametrize(("change", "message"), [
    ({"1W0": "1I0", "1I0": "1W0"}, "east-0: 1W0 before 1I0"),
    ({"0W0": "0B0"}, "east-0: 0B0 runs a second time (a backward is B, or I then W)"),
    ({"1I0": "1B0", "1W0": "1I0"}, "east-0: 1I0 runs a second time"),
    ({"1I0": "1SEND_B0", "1SEND_B0": "1I0"}, "east-0: 1SEND_B0 sends before 1B0 (or 1I0)"),
    ({"0W0": "0STEP", "0STEP": "0W0"}, "east-0: 0STEP before all backwards finished"),
    ({"1W0": "0PREFILL", "1STEP": "0PREFILL"}, "east-0 runs 1I0 but never 1W0"),
    ({"1RECV_F0": "0PREFILL", "0SEND_F0": "0PREFILL"}, "east-0: 1F0 runs before 1RECV_F0"),
])
def test_split_backwards_follow_torchs_rules(change: dict[str, str], message: str) -> None:
    actions = [change.get(a, a) for a in SPLIT]
    with pytest.raises(PlanError, match=re.escape(message)):
        validate_plan(_one_gpu(actions), TOPOLOGY)


def test_an_overlapped_unit_runs_its_parts_in_order() -> None:
    ok = ["0F0", "0F1", "0SEND_F0", "1RECV_F0", "1F0", "(0F2;1B0)OVERLAP_F_B", "0SEND_F1",
          "0SEND_F2", "1SEND_B0", "0RECV_B0", "1RECV_F1", "(1F1;0B0)OVERLAP_F_B", "1B1",
          "1SEND_B1", "1RECV_F2", "1F2", "1B2", "1SEND_B2", "0RECV_B1", "0B1", "0RECV_B2", "0B2",
          "0STEP", "1STEP"]
    plan = replace(_one_gpu(ok), microbatches=3)
    validate_plan(plan, TOPOLOGY)
    assert Feature.OVERLAP in plan.features and Feature.VIRTUAL in plan.features
    early = [a.replace("(0F2;1B0)", "(1B0;0F2)") for a in ok]  # 1B0 before its input
    early = ["1B0" if a == "1F0" else "1F0" if a == "1B0" else a for a in early]
    with pytest.raises(PlanError, match="backward before forward: 1B0 before 1F0"):
        validate_plan(replace(_one_gpu(early), microbatches=3), TOPOLOGY)


@pytest.mark.parametrize(("placement", "message"), [
    ({(0, 0): ("east-0",), (0, 1): ("east-1",), (1, 0): ("east-2",), (1, 1): ("east-0",)},
     "GPU east-0 is used by replica 0 stage 0 and by replica 1 stage 1"),
    ({(0, 0): ("east-0",), (0, 1): ("east-0",), (0, 2): ("east-1",)},
     "GPU east-1 holds stage 2, GPU east-0 stages 0, 1: every GPU of a plan holds as many"),
    ({(0, 0): ("east-0", "east-1"), (0, 1): ("east-1", "east-2")},
     "GPU east-1 holds stages 0 and 1 of replica 0 in different tensor-parallel groups"),
])
def test_placements_of_virtual_stages(placement: dict[tuple[int, int], tuple[str, ...]],
                                      message: str) -> None:
    dp = 1 + max(r for r, _ in placement)
    pp = 1 + max(s for _, s in placement)
    tp = len(next(iter(placement.values())))
    plan = Plan("hand", dp, pp, 1, 1, (1,) * pp, placement, {}, {}, {}, tp=tp)
    with pytest.raises(PlanError, match=re.escape(message)):
        validate_plan(plan, TOPOLOGY)


def test_a_gpu_lists_only_the_stages_it_holds() -> None:
    plan = _plan(Schedule.INTERLEAVED_1F1B)
    gpu = plan.lead_gpu(0, 0)
    assert plan.stages_of(gpu) == (0, 2)
    with pytest.raises(PlanError, match=rf"{gpu} runs stages 0, 2 but lists 1F0"):
        validate_plan(_with(plan, gpu, ["1F0"]), TOPOLOGY)


def test_the_interpreter_says_which_stage_and_part_and_what_stays_on_the_gpu() -> None:
    steps = interpret_steps([Action.parse(a) for a in [
        "0SEND_F1", "1RECV_F1", "1I1", "1W1", "1SEND_B1", "1WAIT_B1", "1RECV_B0",
        "(0F2;1B0)OVERLAP_F_B"]], (1, 0), 3)
    assert steps[0] == Send(Phase.FORWARD, 1, 1, local=True)
    assert steps[1] == Receive(Phase.FORWARD, 1, 0, 1, local=True)
    assert steps[2] == Compute(Phase.BACKWARD, 1, 1, Part.INPUT)
    assert steps[3] == Compute(Phase.BACKWARD, 1, 1, Part.WEIGHT)
    assert steps[4] == Send(Phase.BACKWARD, 0, 1, local=True)
    assert steps[5] == SendWait(Phase.BACKWARD, 0, 1, local=True)
    assert isinstance(steps[4], Send) and steps[4].stage == 1
    assert steps[6] == Receive(Phase.BACKWARD, 1, 2, 0, local=False)  # stage 2: elsewhere
    assert steps[7] == Overlapped((Compute(Phase.FORWARD, 2, 0), Compute(Phase.BACKWARD, 0, 1)))
    with pytest.raises(ValueError, match="a GPU holding stages 0, 1 cannot run 2RECV_B0"):
        interpret_steps([Action.parse("2RECV_B0")], (0, 1), 3)


def test_activations_are_read_from_the_actions() -> None:
    def held(*texts: str) -> dict[int, int]:
        return in_flight([Action.parse(t) for t in texts])

    assert held("0F0", "0F1", "0B0", "0F2", "0B1", "0B2") == {0: 2}
    assert held("0F0", "0I0", "0F1", "0W0", "0I1", "0W1") == {0: 2}  # I keeps what W needs
    assert held("0F0", "0I0", "0W0", "0F1", "0I1", "0W1") == {0: 1}
    assert held("0F0", "1F0", "(0F1;1B0)OVERLAP_F_B", "0B0", "0B1") == {0: 2, 1: 1}
    layers = {0: 3, 1: 1}
    assert peak_layers_held([Action.parse(t) for t in ("0F0", "1F0", "1B0", "0F1")],
                            layers) == 6


def test_memory_counts_every_stage_a_gpu_holds() -> None:
    plan = _plan(Schedule.INTERLEAVED_1F1B)
    gpu = plan.lead_gpu(0, 0)
    held = in_flight(plan.actions[gpu])
    params = sum(stage_params(JOB.model, plan.layers[s], s == 0, s == 3) for s in (0, 2))
    peak = max(held.values())
    assert gpu_memory_bytes(JOB, plan.layers, (0, 2), 1, plan.actions[gpu]) >= \
        params * 16 + peak * plan.layers[0] * JOB.activation_bytes
    big = replace(JOB, model=parse_job({"model": "gpt3-175b"}).model)
    placement = virtual_placement(file_order_placement(TOPOLOGY, 1, 2, 1),
                                  Schedule.INTERLEAVED_1F1B, 2)
    with pytest.raises(InputError, match=r"stages 0, 2 \(48 layers, tp 1\) needs"):
        check_memory(TOPOLOGY, big, placement, Schedule.INTERLEAVED_1F1B)


def test_the_ideal_bubble_is_the_schedules_own() -> None:
    for schedule in (Schedule.GPIPE, Schedule.ONE_F_ONE_B):
        plan = _plan(schedule, ranks=4, virtual=1)
        assert ideal_bubble_fraction(plan) == pytest.approx(3 / (4 + 3))
    interleaved = _plan(Schedule.INTERLEAVED_1F1B, ranks=2, virtual=2)
    assert ideal_bubble_fraction(interleaved) == pytest.approx(1 / (2 * 4 + 1))


def test_the_grid_has_a_column_per_gpu() -> None:
    plan = _plan(Schedule.DUALPIPE_V, ranks=2, virtual=2)
    grid = plan_grid(plan, max_rows=None)
    assert grid.splitlines()[0].split()[1:] == ["r0s0,3", "r0s1,2"]
    assert "(2F2;1B0)" in grid and "(a;b): a and b run as one unit (OVERLAP_F_B)" in grid


def test_a_cycle_syncs_every_stage_of_a_gpu() -> None:
    plan = _plan(Schedule.ZB_V, dp=2, gradients=None)
    delta = Collective(Reduces.DELTAS)

    def sync(stage: int) -> list[Action]:
        return [Action(stage, Op.ALLREDUCE, None, delta), Action(stage, Op.OUTER_STEP)]

    synced = cycled(plan, [lambda _s: [], sync])
    validate_plan(synced, TOPOLOGY)
    gpu = synced.lead_gpu(0, 0)
    assert [str(a) for a in synced.programs[0][gpu][-4:]] == [
        "0ALLREDUCE[delta]", "0OUTER_STEP", "3ALLREDUCE[delta]", "3OUTER_STEP"]
    with pytest.raises(PlanError, match="replicas would diverge"):
        validate_plan(plan, TOPOLOGY)


def test_both_backends_run_what_torch_schedules_need() -> None:
    spec = RunSpec.build("simulate", TOPOLOGY, JOB, policy="interleaved-zb")
    for schedule in (Schedule.INTERLEAVED_ZB, Schedule.DUALPIPE_V):
        SimulatorBackend(plan_with_simulator).check(spec, _plan(schedule), None)
        EmulatorBackend(SimulatorPrediction(plan_with_simulator), plan_with_simulator).check(
            replace(spec, backend="emulate"), _plan(schedule), None)


def test_acceptance_interleaved_1f1b_on_paper_3dc(tmp_path: Path) -> None:
    from tests.test_torch_schedules import _runner

    out = tmp_path / "plan.csv"
    code, text, err = call(["plan", PAPER, "-p", "interleaved-1f1b", "-o", "virtual=2",
                            "--pp", "4", "--microbatches", "8", "--csv", str(out)])
    assert code == 0, err
    assert "r0s0,4" in text and "pp 4 (x 2 virtual stages = 8 stages)" in text
    saved = [row.split(",") for row in out.read_text().splitlines()]
    gpu_of_stage = {int(row[2]): row[3] for row in saved if row[0] == "place" and row[1] == "0"}
    actions = {row[1]: row[2:] for row in saved if row[0] == "actions"}
    torch_order = _runner("interleaved-1f1b", 4, 2, 8).pipeline_order
    for rank in range(4):
        ours = [a for a in actions[gpu_of_stage[rank]] if Action.parse(a).op.is_compute]
        assert ours == [str(a) for a in torch_order[rank] if a is not None]
    code, text, _ = call(["plan", PAPER, "--load", str(out)])
    assert code == 0 and "interleaved-1f1b" in text


def test_plugins_lists_torchs_schedules() -> None:
    code, text, _ = call(["plugins"])
    assert code == 0
    for name in ("interleaved-1f1b", "looped-bfs", "interleaved-zb", "zb-v", "dualpipe-v"):
        assert re.search(rf"^training\s+{name}\s", text, re.MULTILINE), name
    assert "virtual=2" in text


def test_simulate_runs_a_virtual_plan(tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, text, err = call(["simulate", PAPER, "-p", "zb-v", "--pp", "4", "--microbatches", "8",
                            "--iterations", "2", "--out", str(out)])
    assert code == 0, err
    assert "simulate run of zb-v on paper-3dc: ok" in text
    assert (out / "results.json").exists()


def test_a_hand_edited_virtual_plan_loads(tmp_path: Path) -> None:
    path = tmp_path / "hand.csv"
    plan = replace(_one_gpu(SPLIT), layers=(4, 4), microbatch_size=JOB.microbatch_size)
    path.write_text(plan_to_csv(plan))
    code, text, err = call(["plan", str(Path(PAPER).with_name("two-dc.yaml")), "--load",
                            str(path), "--set", "model=tiny", "--set", "model.layers=8",
                            "--set", "microbatch_size=1"])
    assert code == 0, err
    assert "r0s0,1" in text and "1I0" in text


@pytest.mark.parametrize("schedule", [Schedule.INTERLEAVED_1F1B, Schedule.ZB_V,
                                      Schedule.ONE_F_ONE_B])
def test_replicas_holding_the_same_stages_share_one_order_and_one_action_list(
        schedule: Schedule) -> None:
    """What a GPU does follows from the stages it holds: its replicas' GPUs get one compute
    order and one action list (by identity, which validation and the simulator read once),
    found in one pass over the placement."""
    from testbed.plan.build import compute_orders, stages_held

    virtual = 1 if schedule is Schedule.ONE_F_ONE_B else 2
    plan = _plan(schedule, dp=2, virtual=virtual)
    placement = dict(plan.placement)
    held = stages_held(placement)
    orders = compute_orders(JOB, placement, schedule, schedule.label(0), plan.microbatches)
    for stage in range(plan.pp):
        first, second = plan.lead_gpu(0, stage), plan.lead_gpu(1, stage)
        assert first != second and plan.actions[first] is plan.actions[second]
        group = plan.placement[(0, stage)]
        assert held[group] == plan.stages_of(first) and stage in held[group]
        assert orders[group] is orders[plan.placement[(1, stage)]]
