"""Losing a worker mid-run (a scenario's failures) in the simulator, and the decisions
behind `--on-failure` that both backends share (testbed.run.recovery, testbed.run.segments)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.errors import InputError, PlanError
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.experiments.run import run
from testbed.plan.jitter import Jitter
from testbed.policy import training_policy
from testbed.run.recovery import renamed_spans, resume_at, resume_from, survivors
from testbed.run.spec import RunSpec
from testbed.scenario.scenario import Recovery, WorkerLoss
from testbed.topology import load_topology

pytestmark = pytest.mark.usefixtures("shared_planning")

ROOT = Path(__file__).resolve().parent.parent
TWO = ROOT / "topologies" / "two-dc.yaml"
THREE = ROOT / "topologies" / "paper-3dc.yaml"
ITERATIONS = 10


def _scenario(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def _simulate(tmp_path: Path, name: str, text: str | None, on_failure: str = "stop",
              every: int = 2, topology: Path = TWO, policy: str = "gpipe") -> dict[str, Any]:
    scenario = _scenario(tmp_path, text) if text is not None else None
    inputs = load_inputs(topology, scenario=scenario, sets=(f"iterations={ITERATIONS}",))
    # equal shares: a restarted run's iterations repeat the first's exactly
    spec = RunSpec.build("simulate", inputs.topology, inputs.job, policy=policy,
                         events=inputs.events, scenario=inputs.scenario, on_failure=on_failure,
                         checkpoint_every=every, jitter=Jitter(share=0.0))
    outcome = run(spec, tmp_path / name)
    return outcome.results


def _spans(tmp_path: Path, name: str) -> list[dict[str, Any]]:
    return json.loads((tmp_path / name / "spans.json").read_text())["spans"]  # type: ignore[no-any-return]


def _healthy_end(tmp_path: Path) -> list[float]:
    results = _simulate(tmp_path, "healthy", None)
    ends: list[float] = []
    for t in results["iteration_time_s"]["all"]:
        ends.append((ends[-1] if ends else 0.0) + t)
    return ends


def test_stop_ends_the_run_at_the_failure_and_says_so(tmp_path: Path) -> None:
    ends = _healthy_end(tmp_path)
    at = (ends[4] + ends[5]) / 2
    results = _simulate(tmp_path, "stop", f"failures: [{{at: {at}s, worker: west-1}}]")
    assert results["status"] == "failed"
    assert results["error"] == (f"worker west-1 (replica 1, stage 1) lost at {at:g} s "
                                "(scenario failure; --on-failure stop)")
    assert results["iterations"] == 5 and results["iterations_requested"] == ITERATIONS
    (failure,) = results["failures"]
    assert failure["resumed_s"] is None and failure["completed"] == 5
    assert max(s["end"] for s in _spans(tmp_path, "stop") if s["kind"] != "failure") <= at


def test_stop_is_exit_1_with_the_error_on_one_line(tmp_path: Path) -> None:
    path = _scenario(tmp_path, "failures: [{at: 0.1s, worker: east-0}]")
    result = subprocess.run(
        [sys.executable, "-c", "from testbed.cli.main import main; main()", "simulate", str(TWO),
         "--scenario", str(path), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("testbed: error")]
    assert errors == ["testbed: error: worker east-0 (replica 0, stage 0) lost at 0.1 s "
                      "(scenario failure; --on-failure stop)"]
    assert json.loads((tmp_path / "out" / "results.json").read_text())["status"] == "failed"


def test_restart_goes_on_from_the_checkpoint_once_the_gpu_is_back(tmp_path: Path) -> None:
    ends = _healthy_end(tmp_path)
    at, back = (ends[4] + ends[5]) / 2, ends[-1]  # back after the whole run would have ended
    results = _simulate(tmp_path, "restart",
                        f"failures: [{{at: {at}s, worker: west-1, back: {back}s}}]\n"
                        "recovery: {detect: 0.05s, restart: 0.2s}", "restart", every=2)
    assert results["status"] == "ok" and results["iterations"] == ITERATIONS
    (failure,) = results["failures"]
    assert failure["completed"] == 5 and failure["resumed_from"] == 4  # every 2
    assert failure["checkpoint_s"] == pytest.approx(ends[3])
    assert failure["detected_s"] == pytest.approx(at + 0.05)
    assert failure["resumed_s"] == pytest.approx(back + 0.2)  # waited for the GPU
    assert failure["time_lost_s"] == pytest.approx(back + 0.2 - ends[3])
    assert failure["plan_after"] == failure["plan_before"]
    spans = _spans(tmp_path, "restart")
    steps = sorted((s["iteration"], s["gpu"]) for s in spans if s["kind"] == "step")
    assert steps == sorted((i, g) for i in range(ITERATIONS)
                           for g in ("east-0", "east-1", "west-0", "west-1"))  # once each
    redone = min(s["start"] for s in spans if s["iteration"] == 4)
    assert redone == pytest.approx(back + 0.2)
    # a healthy iteration after the restart is as long as before it: the run is the same
    times = results["iteration_time_s"]["all"]
    assert times[-1] == pytest.approx(times[2], rel=1e-6)
    assert results["goodput_tokens_per_s"] < results["tokens"]["total"] / ends[-1]


def test_replan_goes_on_at_once_on_the_gpus_left(tmp_path: Path) -> None:
    ends = _healthy_end(tmp_path)
    at = (ends[4] + ends[5]) / 2
    results = _simulate(tmp_path, "replan", f"failures: [{{at: {at}s, worker: west-1}}]\n"
                        "recovery: {detect: 0.05s, restart: 0.2s}", "replan", every=3)
    assert results["status"] == "ok" and results["iterations"] == ITERATIONS
    (failure,) = results["failures"]
    assert failure["resumed_from"] == 3 and failure["resumed_s"] == pytest.approx(at + 0.25)
    after = [g for gpus in failure["plan_after"]["placement"].values() for g in gpus]
    assert "west-1" not in after and after
    spans = _spans(tmp_path, "replan")
    later = [s for s in spans if s["kind"] != "failure" and s["start"] >= at]
    assert later and all(s.get("gpu") != "west-1" for s in later)
    marks = [s for s in spans if s["kind"] == "failure"]
    assert [(m["gpu"], m["start"], m["end"]) for m in marks] == [
        ("west-1", at, pytest.approx(at + 0.25))]
    steps = {s["iteration"] for s in spans if s["kind"] == "step"}
    assert steps == set(range(ITERATIONS))


def test_replan_renames_nothing_when_the_first_gpu_of_a_dc_is_lost(tmp_path: Path) -> None:
    results = _simulate(tmp_path, "replan", "failures: [{at: 0.1s, worker: west-0}]",
                        "replan", every=1, policy="1f1b")
    assert results["status"] == "ok"
    (failure,) = results["failures"]
    after = [g for gpus in failure["plan_after"]["placement"].values() for g in gpus]
    assert "west-0" not in after
    used = {s["gpu"] for s in _spans(tmp_path, "replan")
            if s["kind"] == "forward" and s["start"] > failure["resumed_s"]}
    assert used == set(after) and "west-0" not in used


def test_without_checkpoints_a_recovery_starts_over(tmp_path: Path) -> None:
    results = _simulate(tmp_path, "over", "failures: [{at: 0.2s, worker: east-1}]\n"
                        "recovery: {detect: 0s, restart: 0s}", "replan", every=0)
    (failure,) = results["failures"]
    assert failure["resumed_from"] == 0 and failure["lost_work_s"] == pytest.approx(0.2)
    assert results["iterations"] == ITERATIONS


def test_a_failure_of_a_gpu_the_plan_does_not_use_changes_nothing(tmp_path: Path) -> None:
    from testbed.experiments.planning import plan_with_simulator
    from testbed.policy import training_policy

    inputs = load_inputs(TWO)
    plan = plan_with_simulator(training_policy("atlas"), inputs.topology, inputs.job)
    idle = next(g.name for g in inputs.topology.gpus() if g.name not in plan.used_gpus())
    healthy = _simulate(tmp_path, "a", None, policy="atlas")
    lost = _simulate(tmp_path, "b", f"failures: [{{at: 0s, worker: {idle}}}]",
                     policy="atlas")
    assert lost["status"] == "ok" and lost["failures"] == []
    assert lost["iteration_time_s"] == healthy["iteration_time_s"]


def test_restart_needs_the_gpu_back_and_says_so_before_running(tmp_path: Path) -> None:
    path = _scenario(tmp_path, "failures: [{at: 1s, worker: east-1}]")
    inputs = load_inputs(TWO, scenario=path)
    spec = RunSpec.build("simulate", inputs.topology, inputs.job, policy="gpipe",
                         scenario=inputs.scenario, on_failure="restart")
    with pytest.raises(InputError, match=r"scenario\.yaml: failures: --on-failure restart "
                       r"waits for a lost GPU to be back, and east-1 never is"):
        run(spec, tmp_path / "out")
    assert not (tmp_path / "out" / "results.json").exists()
    with pytest.raises(PlanError, match="never brings it back"):
        resume_at(WorkerLoss(1.0, "east-1"), Recovery(), "restart")


def test_recovery_resumes_at_the_last_checkpoint_between_cycles() -> None:
    assert resume_from(7, 0, 3, 1) == 6
    assert resume_from(7, 0, 4, 2) == 4
    assert resume_from(5, 4, 3, 1) == 4  # its own start is a checkpoint
    assert resume_from(2, 0, 3, 1) == 0
    assert resume_from(9, 0, 0, 1) == 0
    assert resume_at(WorkerLoss(2.0, "x", 3.0), Recovery(1.0, 10.0), "restart") == (3.0, 13.0)
    assert resume_at(WorkerLoss(2.0, "x", 9.0), Recovery(1.0, 10.0), "restart") == (3.0, 19.0)
    assert resume_at(WorkerLoss(2.0, "x", 9.0), Recovery(1.0, 10.0), "replan") == (3.0, 13.0)
    # another GPU of the plan lost before the restart: it waits for that one too, and for
    # a third lost while it waits; one lost after it started is the next segment's
    others = [WorkerLoss(5.0, "y", 20.0), WorkerLoss(25.0, "z", 26.0),
              WorkerLoss(40.0, "w", 41.0)]
    assert resume_at(WorkerLoss(2.0, "x", 3.0), Recovery(1.0, 10.0), "restart",
                     others) == (3.0, 36.0)
    with pytest.raises(PlanError, match="never brings it back"):
        resume_at(WorkerLoss(2.0, "x", 3.0), Recovery(1.0, 10.0), "restart",
                  [WorkerLoss(4.0, "y")])


def test_survivors_keep_each_gpu_under_its_own_name() -> None:
    topology = load_topology(THREE)
    place = survivors(topology, {"central-0", "central-2"})
    central = place.topology.dc("central")
    assert central.gpus == topology.dc("central").gpus - 2
    assert place.physical("central-0") == "central-1"
    assert place.physical("central-1") == "central-3"
    assert place.local("central-3") == "central-1" and place.local("central-0") is None
    spans = renamed_spans([{"gpu": "central-0", "kind": "send", "start": 0.0, "end": 1.0,
                            "iteration": 0, "peer": "central-1"}], place.names)
    assert (spans[0]["gpu"], spans[0]["peer"]) == ("central-1", "central-3")
    gone = survivors(topology, {f"west-{i}" for i in range(topology.dc("west").gpus)})
    assert [dc.name for dc in gone.topology.datacenters] == ["east", "central"]
    assert all("west" not in (link.a, link.b) for link in gone.topology.links)
    with pytest.raises(PlanError, match="every GPU is lost"):
        survivors(topology, {g.name for g in topology.gpus()})


def test_compare_and_the_api_take_a_scenario_and_what_a_failure_does(tmp_path: Path) -> None:
    from testbed import api

    path = _scenario(tmp_path, "failures: [{at: 0.2s, worker: west-1}]\n"
                     "recovery: {detect: 0s, restart: 0.1s}")
    inputs = api.load(TWO, scenario=path, iterations=ITERATIONS)
    result = api.simulate(inputs, "gpipe", on_failure="replan", checkpoint_every=2,
                          out=tmp_path / "api")
    assert result.results["failures"][0]["action"] == "replan"
    assert result.results["iterations"] == ITERATIONS
    out = tmp_path / "compare"
    done = subprocess.run(
        [sys.executable, "-c", "from testbed.cli.main import main; main()", "compare", str(TWO),
         "-p", "gpipe", "-p", "1f1b", "--scenario", str(path), "--on-failure", "replan",
         "--checkpoint-every", "2", "--iterations", str(ITERATIONS), "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    saved = json.loads((out / "compare.json").read_text())
    assert saved["scenario"] == str(path) and saved["on_failure"] == "replan"
    for entry in saved["runs"]:
        assert entry["results"]["failures"][0]["worker"] == "west-1"


def test_a_checkpoint_moves_to_another_split_of_the_layers(tmp_path: Path) -> None:
    """Each parameter and its Adam moments, under the new plan's stages, are those the
    old plan's stages saved (replica 0's, for every new replica)."""
    import torch

    from testbed.emulator.runtime.worker.compute.model import build_stages
    from testbed.emulator.runtime.worker.compute.reference import merge_stages
    from testbed.emulator.runtime.worker.compute.reshard import reshard
    from testbed.job.model import MODEL_PRESETS

    shape, old, new = MODEL_PRESETS["tiny"], (2, 2), (1, 3)
    source = tmp_path / "old"
    source.mkdir()
    for stage, module in enumerate(build_stages(shape, old, seed=3)):
        optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
        for p in module.parameters():
            p.grad = torch.full_like(p, 0.5 + stage)
        optimizer.step()
        torch.save({"model": module.state_dict(), "optimizer": optimizer.state_dict(),
                    "syncs": {"outer": {}, "optimizers": {}, "residuals": {}, "averaged": {}}},
                   source / f"r0-s{stage}.pt")
    reshard(source, old, tmp_path / "new", new, 2, shape, seed=3)
    saved = [torch.load(source / f"r0-s{s}.pt") for s in range(2)]
    before = merge_stages([s["model"] for s in saved], old)
    for replica in range(2):
        moved = [torch.load(tmp_path / "new" / f"r{replica}-s{s}.pt") for s in range(2)]
        after = merge_stages([m["model"] for m in moved], new)
        assert after.keys() == before.keys()
        assert all(torch.equal(after[k], before[k]) for k in before)
        for stage, module in enumerate(build_stages(shape, new, seed=3)):
            optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
            optimizer.load_state_dict(moved[stage]["optimizer"])  # loads: shapes match
            module.load_state_dict(moved[stage]["model"])
    # one Adam step on gradient g leaves exp_avg = 0.1 g: new stage 1 holds block 1, which
    # old stage 0 stepped with 0.5, and blocks 2-3 and the head, stepped with 1.5
    state = torch.load(tmp_path / "new" / "r0-s1.pt")["optimizer"]["state"]
    names = [n for n, _ in build_stages(shape, new, seed=3)[1].named_parameters()]
    assert len(state) == len(names)
    for index, name in enumerate(names):
        grad = 0.5 if name.startswith("blocks.0.") else 1.5
        assert torch.allclose(state[index]["exp_avg"],
                              torch.full_like(state[index]["exp_avg"], 0.1 * grad)), name


def test_outer_optimizer_state_is_not_moved_silently(tmp_path: Path) -> None:
    import torch

    from testbed.emulator.runtime.worker.compute.model import build_stages
    from testbed.emulator.runtime.worker.compute.reshard import reshard
    from testbed.errors import TestbedError
    from testbed.job.model import MODEL_PRESETS

    shape = MODEL_PRESETS["tiny"]
    (module,) = build_stages(shape, (4,), seed=0)
    torch.save({"model": module.state_dict(),
                "optimizer": torch.optim.Adam(module.parameters()).state_dict(),
                "syncs": {"outer": {"x": torch.zeros(1)}}}, tmp_path / "r0-s0.pt")
    with pytest.raises(TestbedError, match="outer optimizer state"):
        reshard(tmp_path, (4,), tmp_path / "new", (2, 2), 1, shape, 0)


TORCH_CSV = "0F0,0F1,0F2,0F3,0B0,0B1,0B2,0B3\n1F0,1B0,1F1,1B1,1F2,1B2,1F3,1B3\n"
"""A given plan in torch's form: its policy (`torch-csv`) is not installed, so the run's
is plan-file, which makes no plan."""


def test_a_given_plan_meets_the_scenario_beside_the_policies(tmp_path: Path) -> None:
    from testbed import api

    path = _scenario(tmp_path, "failures: [{at: 0.2s, worker: east-1, back: 0.3s}]\n"
                     "recovery: {detect: 0s, restart: 0.1s}")
    given = tmp_path / "torch.csv"
    given.write_text(TORCH_CSV)
    inputs = api.load(TWO, scenario=path, iterations=ITERATIONS)
    done = api.compare(inputs, ["gpipe"], plans=[given], on_failure="restart",
                       checkpoint_every=2, out=tmp_path / "compare")
    assert set(done) == {"gpipe", str(given)}
    for result in done.values():
        assert result.results["iterations"] == ITERATIONS, result.error
        assert [f["worker"] for f in result.results["failures"]] == ["east-1"]
        assert result.results["failures"][0]["action"] == "restart"
    assert done[str(given)].results["plan_file"] == str(given)
    saved = json.loads((tmp_path / "compare" / "compare.json").read_text())
    assert saved["scenario"] == str(path) and saved["plans"] == [str(given)]


def test_replan_of_a_plan_no_policy_makes_is_refused_before_running(tmp_path: Path) -> None:
    from testbed import api

    path = _scenario(tmp_path, "failures: [{at: 0.2s, worker: east-1}]")
    given = tmp_path / "torch.csv"
    given.write_text(TORCH_CSV)
    inputs = api.load(TWO, scenario=path, iterations=ITERATIONS)
    with pytest.raises(InputError, match=r"^--on-failure: replan asks the run's policy for "
                       r"a new plan, and plan-file \(the given plan's\) makes none"):
        api.simulate(inputs, plan=given, on_failure="replan", out=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    replanned = api.simulate(inputs, "1f1b", plan=given, on_failure="replan",
                             out=tmp_path / "named")  # a policy named with it plans again
    assert replanned.results["iterations"] == ITERATIONS
    assert replanned.results["failures"][0]["plan_after"]["policy"] == "1f1b"


def test_a_gpu_holding_several_stages_is_lost_with_all_of_them(tmp_path: Path) -> None:
    """ZB-V puts two stages on each GPU (east-1 holds replica 1's stages 0 and 3): the
    failure names both, and an emulated segment's checkpoint is complete with a part from
    each GPU, not one from each stage."""
    from testbed.emulator.backend_segments import _checkpoints
    from testbed.run.segments import Segment

    results = _simulate(tmp_path, "zbv", "failures: [{at: 0.3s, worker: east-1}]",
                        policy="zb-v")
    assert results["status"] == "failed"
    assert results["error"].startswith("worker east-1 (replica 1, stages 0, 3) lost at 0.3 s")
    inputs = load_inputs(TWO, sets=(f"iterations={ITERATIONS}",))
    spec = RunSpec.build("emulate", inputs.topology, inputs.job, policy="zb-v", checkpoint_every=2)
    plan = plan_with_simulator(training_policy("zb-v", {}), inputs.topology, inputs.job)
    checkpoints = _checkpoints(spec, tmp_path / "run", Segment(
        0, inputs.topology, plan, 0, (), (), ()), "emulated")
    assert checkpoints is not None
    gpus = plan.used_gpus()
    assert len(gpus) < len(list(plan.workers()))
    assert [checkpoints.part_written(2, gpu) for gpu in gpus] == \
        [False] * (len(gpus) - 1) + [True]


def test_a_replan_once_the_lost_gpu_is_back_says_it_plans_on_all(tmp_path: Path) -> None:
    ends = _healthy_end(tmp_path)
    at = (ends[4] + ends[5]) / 2
    scenario = _scenario(tmp_path, f"failures: [{{at: {at}s, worker: west-1, back: "
                         f"{at + 0.1}s}}]\nrecovery: {{detect: 0.05s, restart: 0.2s}}")
    inputs = load_inputs(TWO, scenario=scenario, sets=(f"iterations={ITERATIONS}",))
    spec = RunSpec.build("simulate", inputs.topology, inputs.job, policy="gpipe",
                         events=inputs.events, scenario=inputs.scenario, on_failure="replan",
                         checkpoint_every=3)
    said: list[str] = []
    assert run(spec, tmp_path / "back", said.append).results["status"] == "ok"
    gpus = load_topology(TWO).total_gpus
    assert f"replanning on all {gpus} GPUs (every one lost is back)" in said, said


@pytest.mark.parametrize("action", ["stop", "restart", "replan"])
def test_a_failure_at_0s_takes_its_worker_as_training_starts(tmp_path: Path,
                                                            action: str) -> None:
    """A failure at time t takes what runs at t: `at: 0s` was dropped in both backends
    (`ok`, no failures, exit 0) where `at: 1ms` worked."""
    back = ", back: 0.5s" if action == "restart" else ""
    results = _simulate(tmp_path, action, f"failures: [{{at: 0s, worker: east-1{back}}}]\n"
                        "recovery: {detect: 0.05s, restart: 0.2s}", action)
    (failure,) = results["failures"]
    assert (failure["worker"], failure["at_s"], failure["completed"]) == ("east-1", 0.0, 0)
    assert results["scenario"]["failures"][0]["applied"]
    if action == "stop":
        assert results["status"] == "failed" and results["iterations"] == 0
        assert results["error"].startswith("worker east-1 (replica 1, stage 0) lost at 0 s")
        return
    assert results["status"] == "ok" and results["iterations"] == ITERATIONS
    assert failure["resumed_s"] == pytest.approx(0.7 if action == "restart" else 0.25)
    after = {g for gpus in failure["plan_after"]["placement"].values() for g in gpus}
    assert ("east-1" in after) == (action == "restart")


def test_every_segment_meets_the_failures_from_its_first_moment() -> None:
    """What both backends run (testbed.run.segments): the first segment gets a failure at
    0 s, and the one after a recovery a failure at the moment it starts (each was
    dropped: pending failures were those after the segment's start)."""
    from testbed.run.segments import Segment, SegmentResult, run_segments
    from testbed.scenario.scenario import Scenario

    inputs = load_inputs(TWO, sets=(f"iterations={ITERATIONS}",))
    first, second = WorkerLoss(0.0, "east-1", 0.5), WorkerLoss(0.7, "west-1", 2.0)
    scenario = Scenario(failures=(first, second), recovery=Recovery(0.05, 0.2))
    spec = RunSpec.build("simulate", inputs.topology, inputs.job, policy="gpipe", scenario=scenario,
                         on_failure="restart")
    policy = training_policy("gpipe")
    plan = plan_with_simulator(policy, inputs.topology, inputs.job)
    met: list[tuple[WorkerLoss, ...]] = []

    def run(segment: Segment) -> SegmentResult:
        met.append(segment.losses)
        at_once = [loss for loss in segment.losses if loss.at_s == 0]
        return SegmentResult([], at_once[0] if at_once else None)

    joined = run_segments(spec, plan, policy, run, lambda _line: None, plan_with_simulator)
    assert met[0] == (first, WorkerLoss(0.7, "west-1", 2.0))
    assert met[1] == (WorkerLoss(0.0, "west-1", 1.3),)  # resumed at 0.7: 0.5 back + 0.2
    assert [(f.worker, f.at_s) for f in joined.failures] == [("east-1", 0.0), ("west-1", 0.7)]
