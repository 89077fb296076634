"""torch's schedules for several stages per GPU, as plans: every GPU's compute order is the
one torch 2.13's own schedule class computes, and its communication is what torch's
runtime for lowered schedules (`_PipelineScheduleRuntime._step_microbatches`) executes,
traced with stub stages and recording communication helpers. torch is read here
independently of testbed.plan.torch_order."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch.distributed.pipelining.schedules as schedules
from torch.distributed.pipelining._utils import generate_rank_to_stage_mapping

from testbed.errors import InputError
from testbed.job.load import parse_job
from testbed.plan import Action, Op, Plan, parse_plan_csv, plan_to_csv, validate_plan
from testbed.plan.load import load_plan
from testbed.policy import training_policy
from testbed.policy.api import PlanningContext
from testbed.topology import parse_topology

TOPOLOGY = parse_topology(
    {
        "datacenters": [{"name": "east", "gpus": 4}, {"name": "west", "gpus": 4}],
        "wan": [{"between": ["east", "west"], "latency": "20ms", "bandwidth": "1Gbit"}],
    },
    "two.yaml",
)
TINY = parse_job({"model": "tiny"})
JOB = replace(TINY, model=replace(TINY.model, layers=16))
CLASSES = {"interleaved-1f1b": "ScheduleInterleaved1F1B", "looped-bfs": "ScheduleLoopedBFS",
           "interleaved-zb": "ScheduleInterleavedZeroBubble", "zb-v": "ScheduleZBVZeroBubble",
           "dualpipe-v": "ScheduleDualPipeV"}
V_SHAPED = {"zb-v", "dualpipe-v"}

# (schedule, GPUs per pipeline, stages per GPU, microbatches)
CASES = [
    *((name, 4, 2, 8) for name in CLASSES),  # the acceptance case
    ("interleaved-1f1b", 2, 2, 4), ("interleaved-1f1b", 3, 3, 6), ("interleaved-1f1b", 4, 4, 5),
    ("interleaved-1f1b", 2, 1, 3), ("interleaved-1f1b", 4, 2, 12),
    ("looped-bfs", 2, 3, 5), ("looped-bfs", 3, 2, 1), ("looped-bfs", 4, 4, 4),
    ("interleaved-zb", 2, 2, 4), ("interleaved-zb", 3, 3, 6), ("interleaved-zb", 4, 1, 8),
    ("interleaved-zb", 4, 2, 3),
    ("zb-v", 1, 2, 2), ("zb-v", 2, 2, 3), ("zb-v", 3, 2, 7), ("zb-v", 4, 2, 12),
    ("dualpipe-v", 2, 2, 4), ("dualpipe-v", 3, 2, 9), ("dualpipe-v", 4, 2, 13),
]


class _Stub:
    """What torch's schedule classes and their runtime read off and call on a stage; the
    runtime's calls are recorded in `trace`."""

    def __init__(self, index: int, stages: int, ranks: int, rank: int,
                 trace: list[Any]) -> None:
        self.stage_index, self.num_stages = index, stages
        self.group_size, self.group_rank = ranks, rank
        self.is_first, self.is_last = index == 0, index == stages - 1
        self.submod = None
        self.stage_index_to_group_rank: dict[int, int] = {}
        self.trace = trace

    def get_fwd_send_ops(self, mb: int) -> list[tuple[str, int, int]]:
        return [("SEND_F", self.stage_index, mb)]

    def get_bwd_send_ops(self, mb: int) -> list[tuple[str, int, int]]:
        return [("SEND_B", self.stage_index, mb)]

    def get_fwd_recv_ops(self, mb: int) -> list[tuple[str, int, int]]:
        return [("RECV_F", self.stage_index, mb)]

    def get_bwd_recv_ops(self, mb: int) -> list[tuple[str, int, int]]:
        return [("RECV_B", self.stage_index, mb)]

    def forward_one_chunk(self, mb: int, *_args: Any, **_kwargs: Any) -> None:
        self.trace.append(f"{self.stage_index}F{mb}")

    def backward_one_chunk(self, mb: int, full_backward: bool = True, **_kwargs: Any) -> None:
        self.trace.append(f"{self.stage_index}{'B' if full_backward else 'I'}{mb}")

    def backward_weight_one_chunk(self, mb: int, **_kwargs: Any) -> None:
        self.trace.append(f"{self.stage_index}W{mb}")

    def perform_reduce_grad(self, *_args: Any) -> None:
        self.trace.append(f"{self.stage_index}ALLREDUCE")

    def set_local_fwd_input(self, *_args: Any) -> None:
        pass

    def set_local_bwd_input(self, *_args: Any) -> None:
        pass

    def get_local_bwd_output(self, *_args: Any) -> None:
        return None


def _runner(name: str, ranks: int, virtual: int, microbatches: int, rank: int = 0,
            trace: list[Any] | None = None) -> Any:
    stages = ranks * virtual
    style = "v" if name in V_SHAPED else "loop"
    mine = generate_rank_to_stage_mapping(ranks, stages, style)[rank]
    stubs = [_Stub(s, stages, ranks, rank, trace if trace is not None else []) for s in mine]
    return getattr(schedules, CLASSES[name])(stubs, microbatches)


def _torch_trace(monkeypatch: pytest.MonkeyPatch, name: str, ranks: int, virtual: int,
                 microbatches: int, rank: int) -> list[Any]:
    """What torch's runtime does on `rank`, in order: computes, posted sends, waits (for
    receives, right before the compute that needs them; for sends, at the end)."""
    trace: list[Any] = []
    monkeypatch.setattr(schedules, "_batch_p2p", lambda ops, desc=None: (
        trace.extend(("post", op) for op in ops if op[0].startswith("SEND")), list(ops))[1])
    monkeypatch.setattr(schedules, "_wait_batch_p2p",
                        lambda work: trace.extend(("wait", op) for op in work))
    runner = _runner(name, ranks, virtual, microbatches, rank, trace)
    runner._check_inputs = lambda *_a: ([()] * microbatches, [{}] * microbatches)
    for method in ("_initialize_stages", "_maybe_compute_loss", "_maybe_get_loss",
                   "_update_losses"):
        setattr(runner, method, lambda *_a, **_k: None)
    runner._step_microbatches()
    return trace


def _plan(name: str, ranks: int, virtual: int, microbatches: int, dp: int = 2,
          sends: str = "torch") -> Plan:
    job = replace(JOB, pp=ranks, dp=dp, microbatches=microbatches)
    options = {"sends": sends} | ({} if name in V_SHAPED else {"virtual": str(virtual)})
    plan = training_policy(name, options).plan(TOPOLOGY, job, PlanningContext())
    validate_plan(plan, TOPOLOGY)
    return plan


def _ours(plan: Plan, gpu: str) -> list[Any]:
    """What our actions make a backend do, as torch's runtime trace says it: messages
    between two stages of this GPU move nothing, and an OVERLAP_F_B waits for the
    inputs of its parts before it runs them in turn."""
    held = plan.stages_of(gpu)
    out: list[Any] = []
    for action in plan.actions[gpu]:
        op, mb = action.op, action.microbatch
        peer = action.stage + (1 if op in (Op.SEND_F, Op.RECV_B, Op.WAIT_F) else -1)
        if op.is_compute:
            out += [str(leaf) for leaf in action.leaves]
        elif op.is_send and peer not in held:
            out.append(("post", (op.value, action.stage, mb)))
        elif op.is_recv and peer not in held:
            out.append(("wait", (op.value, action.stage, mb)))
        elif op.is_wait:
            out.append(("wait", (f"SEND_{op.value[-1]}", action.stage, mb)))
        elif op is Op.ALLREDUCE:
            out.append(f"{action.stage}ALLREDUCE")
    return out


def _overlaps_wait_first(trace: list[Any], plan: Plan, gpu: str) -> list[Any]:
    """torch's trace with the receives an OVERLAP_F_B's later parts wait for moved before
    its first part, where our plan waits for them."""
    units = [a.leaves for a in plan.actions[gpu] if a.op is Op.OVERLAP_F_B]
    out = list(trace)
    for leaves in units:
        first = out.index(str(leaves[0]))
        for leaf in leaves[1:]:
            at = out.index(str(leaf))
            kind = "RECV_F" if leaf.op is Op.F else "RECV_B"
            wait = ("wait", (kind, leaf.stage, leaf.microbatch))
            if at > 0 and out[at - 1] == wait:
                out.pop(at - 1)
                out.insert(first, wait)
                first += 1
    return out


@pytest.mark.parametrize(("name", "ranks", "virtual", "microbatches"), CASES)
def test_every_gpus_compute_order_is_torchs(name: str, ranks: int, virtual: int,
                                            microbatches: int) -> None:
    plan = _plan(name, ranks, virtual, microbatches)
    order = _runner(name, ranks, virtual, microbatches).pipeline_order
    assert plan.pp == ranks * virtual and plan.gpus_per_pipeline == ranks
    for replica in range(plan.dp):
        for rank in range(ranks):
            gpu = plan.lead_gpu(replica, rank)  # rank r holds stage r in both mappings
            ours = [str(a) for a in plan.actions[gpu] if a.op.is_compute]
            assert ours == [str(a) for a in order[rank] if a is not None], (replica, rank)
            stages = {leaf.stage_index for a in order[rank] if a is not None for leaf in
                      (a.sub_actions or (a,))}
            assert set(plan.stages_of(gpu)) == stages


@pytest.mark.parametrize(("name", "ranks", "virtual", "microbatches"), CASES)
def test_communication_is_what_torchs_runtime_does(monkeypatch: pytest.MonkeyPatch, name: str,
                                                   ranks: int, virtual: int,
                                                   microbatches: int) -> None:
    plan = _plan(name, ranks, virtual, microbatches)
    for rank in range(ranks):
        gpu = plan.lead_gpu(0, rank)
        trace = _torch_trace(monkeypatch, name, ranks, virtual, microbatches, rank)
        assert _ours(plan, gpu) == _overlaps_wait_first(trace, plan, gpu), f"rank {rank}"


def test_eager_sends_never_wait() -> None:
    torch_sends = _plan("interleaved-1f1b", 4, 2, 8)
    eager = _plan("interleaved-1f1b", 4, 2, 8, sends="eager")
    for gpu in eager.used_gpus():
        assert not [a for a in eager.actions[gpu] if a.op.is_wait]
        assert [a for a in eager.actions[gpu] if not a.op.is_wait] == \
            [a for a in torch_sends.actions[gpu] if not a.op.is_wait]


@pytest.mark.parametrize("name", ["zb-v", "dualpipe-v", "interleaved-zb"])
def test_plans_of_torchs_schedules_round_trip_through_csv(name: str) -> None:
    plan = _plan(name, 4, 2, 8)
    again = parse_plan_csv(plan_to_csv(plan), "p.csv")
    assert again == plan
    validate_plan(again, TOPOLOGY)


def test_v_shape_places_stages_g_and_2p_minus_1_minus_g() -> None:
    plan = _plan("zb-v", 4, 2, 8)
    for rank in range(4):
        assert plan.stages_of(plan.lead_gpu(0, rank)) == (rank, 7 - rank)
    looped = _plan("interleaved-1f1b", 2, 3, 4)
    assert [looped.stages_of(looped.lead_gpu(0, r)) for r in range(2)] == [(0, 2, 4), (1, 3, 5)]


def test_stages_on_one_gpu_share_no_connection() -> None:
    plan = _plan("zb-v", 4, 2, 8)
    bottom = plan.lead_gpu(0, 3)
    assert plan.lead_gpu(0, 4) == bottom  # stages 3 and 4 meet at the V's bottom
    assert all(a != b for a, b in plan.connections)


@pytest.mark.parametrize(("name", "ranks", "microbatches", "key", "words"), [
    ("interleaved-1f1b", 4, 9, "job.microbatches", "not a multiple of its 2 rounds"),
    ("interleaved-zb", 2, 5, "job.microbatches", "not a multiple of its 2 rounds"),
    ("dualpipe-v", 4, 7, "job.microbatches", "at least as many microbatches as stages (8)"),
])
def test_torchs_constraints_are_one_line_input_errors(name: str, ranks: int, microbatches: int,
                                                      key: str, words: str) -> None:
    with pytest.raises(InputError, match=rf"{key}: .*{re.escape(words)}") as caught:
        _plan(name, ranks, 2, microbatches)
    assert "\n" not in str(caught.value)


def test_more_stages_than_layers_names_the_layers() -> None:
    with pytest.raises(InputError, match=r"job.model.layers: 16 stages need as many layers, "
                                         "the model has 4"):
        training_policy("interleaved-1f1b", {"virtual": "4"}).plan(
            TOPOLOGY, replace(TINY, pp=4, dp=1, microbatches=4), PlanningContext())


def _write_torch_csv(tmp_path: Path, name: str, ranks: int, virtual: int, microbatches: int,
                     fmt: str) -> Path:
    runner = _runner(name, ranks, virtual, microbatches)
    path = tmp_path / f"{name}-{fmt}.csv"
    runner._dump_csv(str(path), format=fmt)
    return path


@pytest.mark.parametrize("fmt", ["compute_only", "compute_comms"])
@pytest.mark.parametrize(("name", "ranks", "virtual", "microbatches"),
                         [("dualpipe-v", 4, 2, 8), ("interleaved-zb", 2, 3, 4),
                          ("looped-bfs", 4, 1, 3)])
def test_torchs_csv_loads_as_the_plan_of_its_schedule(tmp_path: Path, fmt: str, name: str,
                                                      ranks: int, virtual: int,
                                                      microbatches: int) -> None:
    path = _write_torch_csv(tmp_path, name, ranks, virtual, microbatches, fmt)
    job = replace(JOB, pp=None, dp=2, microbatches=None, global_batch=None,
                  model=replace(JOB.model, layers=ranks * virtual))
    loaded = load_plan(path, TOPOLOGY, job)
    made = _plan(name, ranks, virtual, microbatches)
    assert loaded.microbatches == microbatches and loaded.dp == 2
    assert dict(loaded.placement) == dict(made.placement)  # file order, torch's mapping
    assert dict(loaded.actions) == dict(made.actions)


@pytest.mark.parametrize(("text", "words"), [
    ("0F0,0X1\n", "line 1 column 2: bad action"),
    ("0F0,0B0\n0F1\n", "stage 0 is on rank 0 (line 1) and on rank 1"),
    ("0F0,0STEP\n", "0STEP is not one of torch's schedule actions"),
    ("0F0,2F0,2B0,0B0\n1F0,1B0\n", "line 2: rank 1 runs 1 stage, rank 0 2: every rank holds"),
    ("0F0,0B0\n2F0,2B0\n", "no rank runs stage 1"),
    ("0F0,0B0\n99999999999F0\n", "no rank runs stage 1"),  # no range of 10**11 stages
    ("0F99999999,0B99999999\n", "microbatch 99999999 is past testbed's limit"),
])
def test_bad_torch_csvs_are_one_line_errors(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(InputError, match=re.escape(words)):
        load_plan(path, TOPOLOGY, replace(JOB, model=replace(JOB.model, layers=3)))


def test_a_torch_csv_that_does_not_run_is_a_located_plan_error(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("0F0,0B0\n1B0,1F0\n")  # stage 1's backward before its forward
    with pytest.raises(InputError, match=r"t.csv: line 2 \(west-0\): invalid plan: .*backward "
                                         "before forward: 1B0 before 1F0"):
        load_plan(path, TOPOLOGY, replace(JOB, model=replace(JOB.model, layers=2)))


def test_a_loaded_plan_must_fit_the_job(tmp_path: Path) -> None:
    path = tmp_path / "p.csv"
    path.write_text(plan_to_csv(_plan("zb-v", 4, 2, 8)))
    load_plan(path, TOPOLOGY, JOB)
    with pytest.raises(InputError, match=r"p.csv: meta layers: the plan's stages hold 16 "
                                         r"layers .* the job's model has 8"):
        load_plan(path, TOPOLOGY, replace(JOB, model=replace(JOB.model, layers=8)))


def test_an_overlapped_unit_reads_back_as_torch_writes_it() -> None:
    text = "(0F7;7B3)OVERLAP_F_B"
    action = Action.parse(text)
    assert str(action) == text
    assert action.leaves == (Action(0, Op.F, 7), Action(7, Op.B, 3))
    assert str(schedules._Action.from_str(text)) == text  # torch's own reading of it
