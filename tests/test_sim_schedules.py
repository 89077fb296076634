"""The simulator running torch's schedule language: several stages per GPU, split
backwards, overlapped units, local messages; the ideal bubble, zero-bubble idle, memory
in results and bubble filling on such plans."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from testbed.common.spans import Span
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.inference.bubbles import make_broker
from testbed.job.model import Job, ModelShape
from testbed.metrics.overruns import prefill_overruns
from testbed.metrics.summary import Summary, summarize
from testbed.plan import Action, Op, Plan
from testbed.plan.activations import peak_layers_held
from testbed.plan.ideal import ideal_bubble_fraction
from testbed.plan.jitter import Jitter
from testbed.policy import training_policy
from testbed.report.profile import profile_from_spans
from testbed.sim.simulate import simulate_plan
from testbed.sim.simulator import Simulator
from testbed.topology import parse_topology
from tests.test_cli import call

ROOT = Path(__file__).resolve().parent.parent
SCHEDULES = [("1f1b", {}), ("interleaved-1f1b", {"virtual": "2"}),
             ("looped-bfs", {"virtual": "2"}), ("interleaved-zb", {"virtual": "2"}),
             ("zb-v", {}), ("dualpipe-v", {})]


def _chain(gpus: int, bandwidth: str = "1000Tbit", latency: str = "1ns") -> Any:
    """One GPU per DC in a line: with the defaults, messages cost nothing."""
    names = [f"dc{i}" for i in range(gpus)]
    return parse_topology({
        "datacenters": [{"name": n, "gpus": 1, "bandwidth": "1000Tbit", "latency": 0}
                        for n in names],
        "wan": [{"between": [a, b], "latency": latency, "bandwidth": bandwidth}
                for a, b in itertools.pairwise(names)],
    }, "chain.yaml")


def _simulate(policy: str, options: dict[str, str], iterations: int, gpus: int = 4,
              microbatches: int = 8, dp: int = 1, topology: Any = None,
              ) -> tuple[Plan, list[Span], Summary]:
    """Equal stages (a forward 1 s, a backward 2 s) on a chain of `gpus` GPUs."""
    topology = topology or _chain(gpus * dp)
    virtual = 1 if policy == "1f1b" else 2
    model = ModelShape(layers=gpus * virtual, hidden=8, heads=2, seq_len=4, vocab=16)
    job = Job(model, microbatches=microbatches, dp=dp, pp=gpus, iterations=iterations)
    chosen = training_policy(policy, options)
    plan = plan_with_simulator(chosen, topology, job)
    profile = {s: {"forward_s": 1.0, "backward_s": 2.0} for s in range(plan.pp)}
    spans = Simulator(topology, job, plan, chosen, profile).run().spans
    tokens = plan.dp * plan.microbatches * plan.microbatch_size * model.seq_len
    return plan, spans, summarize(spans, plan.used_gpus(), 0.0, tokens, 0.0)


@pytest.mark.parametrize(("policy", "options"), SCHEDULES)
def test_one_iteration_with_free_messages_idles_as_the_ideal_bubble(
        policy: str, options: dict[str, str]) -> None:
    plan, _, summary = _simulate(policy, options, iterations=1)
    assert summary.utilization_training is not None
    assert 1 - summary.utilization_training == pytest.approx(ideal_bubble_fraction(plan),
                                                             abs=1e-6)


def test_zero_bubble_schedules_idle_less_than_1f1b() -> None:
    idle = {}
    for policy, options in SCHEDULES:
        _, _, summary = _simulate(policy, options, iterations=3)
        assert summary.utilization_training is not None
        idle[policy] = 1 - summary.utilization_training
    assert idle["1f1b"] == pytest.approx(3 / 11, abs=1e-6)  # (p-1)/(m+p-1)
    for zero_bubble in ("interleaved-zb", "zb-v"):
        assert idle[zero_bubble] < idle["interleaved-1f1b"] < idle["1f1b"]
    assert idle["zb-v"] < 0.05


@pytest.mark.parametrize(("policy", "options"), SCHEDULES[1:])
def test_a_gpu_runs_its_stages_one_compute_at_a_time_each_at_its_own_cost(
        policy: str, options: dict[str, str]) -> None:
    plan, spans, _ = _simulate(policy, options, iterations=2)
    computes = [s for s in spans if s["kind"] in ("forward", "backward")]
    for gpu, own in itertools.groupby(sorted(computes, key=lambda s: (s["gpu"], s["start"])),
                                      key=lambda s: s["gpu"]):
        timeline = list(own)
        assert {s["stage"] for s in timeline} == set(plan.stages_of(gpu))
        for a, b in itertools.pairwise(timeline):
            assert b["start"] >= a["end"] - 1e-9
    for span in computes:
        length = span["end"] - span["start"]
        expected = 1.0 if span["kind"] == "forward" else 2.0 if "part" not in span else 1.0
        assert length == pytest.approx(expected)
    parts = {s.get("part") for s in computes if s["kind"] == "backward"}
    split = any(leaf.op is Op.I for a in plan.actions[plan.lead_gpu(0, 0)]
                for leaf in a.leaves)
    assert ({"I", "W"} <= parts) if split else (parts == {None})


def test_an_overlapped_unit_holds_the_gpu_for_its_parts_one_after_the_other() -> None:
    plan, spans, _ = _simulate("dualpipe-v", {}, iterations=1)
    gpu = plan.lead_gpu(0, 0)
    unit = next(a for a in plan.actions[gpu] if a.op is Op.OVERLAP_F_B)
    mine = sorted((s for s in spans if s["gpu"] == gpu and s["kind"] in ("forward", "backward")),
                  key=lambda s: s["start"])
    keys = [(s["stage"], s["microbatch"], s["kind"]) for s in mine]
    first, second = unit.parts
    at = keys.index((first.stage, first.microbatch, "forward" if first.op is Op.F else "backward"))
    assert keys[at + 1] == (second.stage, second.microbatch,
                            "forward" if second.op is Op.F else "backward")
    assert mine[at + 1]["start"] == mine[at]["end"]


def test_messages_between_stages_of_one_gpu_move_no_bytes() -> None:
    """ZB-V's last GPU holds the V's two middle stages: what passes between them stays on
    the GPU, every other message crosses the network once."""
    plan, spans, _ = _simulate("zb-v", {}, iterations=2, gpus=3, microbatches=6,
                               topology=_chain(3, bandwidth="10Gbit", latency="5ms"))
    last = plan.lead_gpu(0, 2)
    assert plan.stages_of(last) == (2, 3)
    transfers = [s for s in spans if s["kind"] == "transfer"]
    assert all(s["src"] != s["dst"] for s in transfers)
    remote = sum(1 for actions in plan.actions.values() for a in actions if a.op.is_send
                 and plan.lead_gpu(0, a.stage + (1 if a.op is Op.SEND_F else -1)) not in
                 (plan.lead_gpu(0, a.stage),))
    assert len(transfers) == 2 * remote
    assert sum(s["bytes"] for s in transfers) == 2 * remote * Job(
        ModelShape(layers=6, hidden=8, heads=2, seq_len=4, vocab=16)).activation_bytes
    local = [s for s in spans if s["kind"] == "recv" and s["gpu"] == last
             and {s["stage"]} <= {2, 3} and s["end"] == s["start"]]
    assert local, "the middle stages' receives were handed over at once"


def test_each_stage_reduces_its_gradients_after_its_last_backward() -> None:
    plan, spans, _ = _simulate("zb-v", {}, iterations=1, microbatches=4, dp=2)
    for gpu in plan.used_gpus():
        for stage in plan.stages_of(gpu):
            done = max(s["end"] for s in spans if s["gpu"] == gpu and s["stage"] == stage
                       and s["kind"] == "backward")
            reduce = [s for s in spans if s["gpu"] == gpu and s["kind"] == "allreduce"
                      and s["stage"] == stage]
            assert len(reduce) == 1 and reduce[0]["start"] >= done - 1e-9


def test_a_profile_of_split_backwards_adds_their_parts() -> None:
    spans = [{"kind": "backward", "stage": 0, "iteration": 1, "start": 0.0, "end": d,
              "part": p} for p, d in (("I", 1.0), ("W", 3.0))]
    spans.append({"kind": "forward", "stage": 0, "iteration": 1, "start": 0.0, "end": 2.0})
    assert profile_from_spans(spans) == {0: {"forward_s": 2.0, "backward_s": 4.0}}


def test_results_hold_each_gpus_activation_peak(tmp_path: Path) -> None:
    paper = str(ROOT / "topologies" / "paper-3dc.yaml")
    code, _, err = call(["simulate", paper, "-p", "zb-v", "--pp", "4", "--dp", "1",
                         "--microbatches", "8", "--iterations", "2", "--out",
                         str(tmp_path / "run")])
    assert code == 0, err
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    inputs = load_inputs(Path(paper), sets=("pp=4", "dp=1", "microbatches=8"))
    plan = plan_with_simulator(training_policy("zb-v"), inputs.topology, inputs.job)
    assert set(results["memory"]) == set(plan.used_gpus())
    for gpu, memory in results["memory"].items():
        layers = {s: plan.layers[s] for s in plan.stages_of(gpu)}
        peak = peak_layers_held(plan.actions[gpu], layers) * inputs.job.activation_bytes
        assert memory["activations_bytes"] == peak > 0
        assert memory["stages"] == list(plan.stages_of(gpu))
        assert memory["total_bytes"] > peak
    assert results["plan"]["stages_per_gpu"] == 2


def test_bubbletea_fills_a_zero_bubble_plans_bubbles_without_slowing_it() -> None:
    inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml",
                         sets=("inference.arrival_rate=100", "iterations=3", "pp=6", "dp=2"))
    policy = training_policy("zb-v")
    plan = plan_with_simulator(policy, inputs.topology, inputs.job)
    equal = Jitter(share=0.0)  # the broker's bubbles are the run's (test_bubbles)
    alone, _ = simulate_plan(inputs.topology, inputs.job, plan, policy, jitter=equal)
    broker = make_broker(inputs.topology, inputs.job, plan, "bubbletea")
    filled, spans = simulate_plan(inputs.topology, inputs.job, plan, policy, broker=broker,
                                  jitter=equal)
    assert filled.iteration_times == pytest.approx(alone.iteration_times, rel=1e-9)
    assert filled.utilization_total is not None and alone.utilization_training is not None
    assert filled.utilization_total > alone.utilization_training + 0.05
    overruns = prefill_overruns(spans)
    assert overruns.prefills > 100 and overruns.overran == 0
    prefilled = {s["gpu"] for s in spans if s["kind"] == "prefill"}
    assert prefilled == set(plan.used_gpus())


def test_a_hand_written_plan_splits_and_overlaps_on_one_gpu() -> None:
    """Every message local: one GPU, nothing on the network, compute back to back."""
    actions = ["0F0", "0F1", "0SEND_F0", "1RECV_F0", "1F0", "(0F2;1B0)OVERLAP_F_B",
               "0SEND_F1", "0SEND_F2", "1SEND_B0", "0RECV_B0", "1RECV_F1",
               "(1F1;0B0)OVERLAP_F_B", "1I1", "1SEND_B1", "1W1", "1RECV_F2", "1F2", "1B2",
               "1SEND_B2", "0RECV_B1", "0B1", "0RECV_B2", "0B2", "0STEP", "1STEP"]
    plan = Plan("hand", 1, 2, 3, 1, (1, 1), {(0, 0): ("dc0-0",), (0, 1): ("dc0-0",)},
                {"dc0-0": tuple(map(Action.parse, actions))}, {}, {})
    model = ModelShape(layers=2, hidden=8, heads=2, seq_len=4, vocab=16)
    job = Job(model, microbatches=3, dp=1, pp=1, iterations=2)
    profile = {s: {"forward_s": 1.0, "backward_s": 2.0} for s in range(2)}
    spans = Simulator(_chain(1), job, plan, training_policy("1f1b"), profile).run().spans
    assert not [s for s in spans if s["kind"] in ("send", "transfer")]
    computes = [s for s in spans if s["kind"] in ("forward", "backward")]
    assert max(s["end"] for s in computes) == pytest.approx(2 * 3 * (1 + 2) * 2)
