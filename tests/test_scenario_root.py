"""Scenarios over the emulated WAN: a bandwidth trace applied to the live link agrees with
the simulator, a straggler holds its GPU longer, and a run that loses a worker goes on
(replanned or restarted) to its last iteration with consistent parameters and nothing
left behind. Needs root (CI runs as root)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from testbed.emulator.runtime.worker.compute.reference import merge_stages, train_one_process
from testbed.experiments.inputs import load_inputs
from testbed.experiments.run import run
from testbed.report.results_schema import check_results
from testbed.run.spec import RunSpec

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("clean_host")]
ROOT = Path(__file__).resolve().parent.parent
TWO = ROOT / "topologies" / "two-dc.yaml"
GPT2 = ("model=gpt2", "microbatches=4")
"""Activations of 6.3 MB: at 1 Gbit/s and below the link, not this machine, sets the pace."""
TRACE = "time_s,bandwidth\n0,250Mbit\n1,1Gbit\n1.5,150Mbit\n3,400Mbit\n"
"""Four iterations of GPT2 under it last about 6.5 s (the same run calm: 3 s)."""


def _spec(tmp_path: Path, backend: str, scenario: str | None, sets: tuple[str, ...],
          files: dict[str, str] | None = None, **more: Any) -> RunSpec:
    path = None
    if scenario is not None:
        path = tmp_path / "scenario.yaml"
        path.write_text(scenario)
        for name, text in (files or {}).items():
            (tmp_path / name).write_text(text)
    inputs = load_inputs(TWO, scenario=path, sets=sets)
    return RunSpec.build(backend, inputs.topology, inputs.job, policy=more.pop("policy", "gpipe"),
                         events=inputs.events, scenario=inputs.scenario, **more)


def _results(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "results.json").read_text())  # type: ignore[no-any-return]


def test_a_bandwidth_trace_on_the_live_link_agrees_with_the_simulator(tmp_path: Path) -> None:
    scenario = "traces: [{link: east-west, csv: bw.csv}]"
    sets = (*GPT2, "iterations=4")
    files = {"bw.csv": TRACE}
    emulated = run(_spec(tmp_path, "emulate", scenario, sets, files, compute="emulated"),
                   tmp_path / "emulated").results
    simulated = run(_spec(tmp_path, "simulate", scenario, sets, files),
                    tmp_path / "simulated").results
    calm = run(_spec(tmp_path, "simulate", None, sets), tmp_path / "calm").results
    assert emulated["status"] == "ok" and emulated["iterations"] == 4
    # the trace more than halves the throughput; the emulator, following it on the live
    # link, stays within a bound this busy machine keeps (the benchmark has the figure)
    assert simulated["tokens_per_s"] < 0.5 * calm["tokens_per_s"]
    assert emulated["tokens_per_s"] == pytest.approx(simulated["tokens_per_s"], rel=0.25), (
        {k: emulated[k] for k in ("iteration_time_s", "emulation", "scenario", "wall_s")},
        simulated["iteration_time_s"])  # what the run had: once 45% slow, cause not found
    assert emulated["scenario"]["traces"][0]["steps"] == 4
    marks = [s for s in json.loads((tmp_path / "emulated" / "spans.json").read_text())["spans"]
             if s["kind"] == "net_event"]
    assert [m["detail"] for m in marks] == ["east<->west follows trace bw.csv"]


def test_a_straggler_holds_its_gpu_at_least_that_many_times_as_long(tmp_path: Path) -> None:
    scenario = "stragglers: [{gpu: west-0, slower: 4}]"
    sets = (*GPT2, "iterations=2")
    emulated = run(_spec(tmp_path, "emulate", scenario, sets, compute="emulated"),
                   tmp_path / "emulated")
    simulated = run(_spec(tmp_path, "simulate", None, sets), tmp_path / "simulated")
    assert emulated.record is not None and simulated.record is not None
    modeled = {(s["gpu"], s["kind"]): s["end"] - s["start"] for s in simulated.record.spans
               if s["kind"] in ("forward", "backward")}
    slowed = [s for s in emulated.record.spans
              if s["gpu"] == "west-0" and s["kind"] in ("forward", "backward")]
    assert len(slowed) == 2 * 2 * 4
    for span in slowed:  # a sleep never ends early: the hold is the lower bound
        assert span["end"] - span["start"] >= 4 * modeled[("west-0", span["kind"])]


@pytest.mark.parametrize(("on_failure", "resumed"), [("replan", 1.2), ("restart", 2.5)])
def test_a_run_that_loses_a_worker_goes_on_and_completes_every_iteration(
        tmp_path: Path, on_failure: str, resumed: float) -> None:
    """Lost at 0.6 s: two-dc's link latency alone makes 30 iterations last longer."""
    scenario = ("failures: [{at: 0.6s, worker: west-1, back: 2s}]\n"
                "recovery: {detect: 0.1s, restart: 0.5s}")
    spec = _spec(tmp_path, "emulate", scenario, ("iterations=30",), compute="emulated",
                 on_failure=on_failure, checkpoint_every=5)
    outcome = run(spec, tmp_path / "run")
    results = outcome.results
    assert outcome.error is None and results["status"] == "ok"
    check_results(results, "results.json")  # the segments' keys are in the shipped schema
    assert results["iterations"] == 30
    (failure,) = results["failures"]
    assert failure["worker"] == "west-1" and failure["action"] == on_failure
    assert failure["resumed_from"] % 5 == 0 and failure["resumed_s"] == pytest.approx(resumed)
    after = [g for gpus in failure["plan_after"]["placement"].values() for g in gpus]
    assert ("west-1" in after) == (on_failure == "restart")
    assert results["time_lost_s"] == pytest.approx(failure["time_lost_s"])
    memory = results["memory"]  # as any emulated run records it: measured, and predicted
    assert memory["workers_peak_bytes"] > 0 and memory["predicted"]
    steps = {s["iteration"] for s in outcome.record.spans if s["kind"] == "step"}  # type: ignore[union-attr]
    assert steps == set(range(30))
    assert (tmp_path / "run" / "logs-2").is_dir()
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoint").iterdir()
                  if p.is_dir()) == ["it30"]  # the moved state is gone


def _final_parameters(run_dir: Path, iterations: int, dp: int, layers: tuple[int, ...]
                      ) -> list[dict[str, torch.Tensor]]:
    saved = run_dir / "checkpoint" / f"it{iterations}"
    return [merge_stages([torch.load(saved / f"r{r}-s{s}.pt")["model"]
                          for s in range(len(layers))], layers) for r in range(dp)]


# 25 s: the default run keeps the replan (emulated, above) and the moving of the state
# (tests/test_recovery.py); this checks them together with real compute
@pytest.mark.benchmark
def test_replanned_real_compute_equals_one_process_on_the_same_placements(
        tmp_path: Path) -> None:
    """The run ends with the parameters of an uninterrupted one on the plans it had: the
    work lost is done again from the checkpoint, with the state moved to the new
    placement (the latency of two-dc's link alone makes 30 iterations outlast the
    failure's time, 1.2 s at least; 0.8 s is past the first checkpoint here, and the
    moving itself is tests/test_recovery.py's). A restart on the same GPUs goes on as
    `up --resume` does, which tests/test_resume_root.py checks bit for bit."""
    scenario = "failures: [{at: 0.8s, worker: west-1}]\nrecovery: {detect: 0.1s, restart: 0.2s}"
    spec = _spec(tmp_path, "emulate", scenario, ("iterations=30",), compute="real",
                 checkpoint_every=2, on_failure="replan")
    outcome = run(spec, tmp_path / "run")
    assert outcome.error is None and outcome.results["iterations"] == 30
    (lost,) = outcome.results["failures"]
    before, after = lost["plan_before"], lost["plan_after"]
    assert after["dp"] * after["pp"] < before["dp"] * before["pp"]
    assert sorted(int(k) for k in outcome.results["loss"]) == list(range(30))
    assert lost["resumed_from"] > 0  # the moved checkpoint, not a start over
    reference = train_one_process(spec.job, before["dp"], before["microbatches"],
                                  [(lost["resumed_from"], after["dp"], after["microbatches"])])
    layers = tuple(after["layers_per_stage"])
    for trained in _final_parameters(tmp_path / "run", 30, after["dp"], layers):
        assert trained.keys() == reference.keys()
        for name, value in reference.items():
            torch.testing.assert_close(trained[name], value, atol=2e-5, rtol=1e-4, msg=name)
