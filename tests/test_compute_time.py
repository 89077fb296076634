"""A job's measured compute time (`compute_time: {step|layer: DURATION}`) costs its
compute: the simulator's step is the stated one, a bad value is one line naming file and
key, and dilation stretches it as it stretches a GPU's peak."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.emulator.runtime.coordinator.pool import WorkerHandle
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.emulator.runtime.coordinator.worker_setup import worker_config
from testbed.errors import InputError
from testbed.experiments.planning import plan_with_simulator
from testbed.job.load import dump_job, load_job, parse_job
from testbed.job.model import ComputeTime, Job, ModelShape
from testbed.metrics.summary import run_iteration_s
from testbed.plan.compute import head_forward_flops, layer_forward_flops, stage_costs
from testbed.plan.describe import describe_plan
from testbed.policy import training_policy
from testbed.run.dilation import dilate_job
from testbed.sim.simulator import Simulator
from testbed.topology import parse_topology
from tests.test_cli import call

MODEL = ModelShape(layers=4, hidden=64, heads=4, seq_len=32, vocab=256)


def _topology(gpus: int) -> Any:
    return parse_topology({"datacenters": [{"name": "east", "gpus": gpus, "gpu": "a100"}],
                           "wan": []}, "one.yaml")


def _simulated_step(job: Job, gpus: int = 1) -> tuple[Any, float]:
    topology = _topology(gpus)
    policy = training_policy("gpipe")
    plan = plan_with_simulator(policy, topology, job)
    result = Simulator(topology, job, plan, policy).run()
    step = run_iteration_s(result.spans, plan.used_gpus(), result.start, plan.period)
    assert step is not None
    return plan, step


@pytest.mark.parametrize("step_s", [0.05, 0.8, 3.0])
def test_a_one_stage_job_s_simulated_step_is_its_stated_step(step_s: float) -> None:
    job = Job(MODEL, microbatches=4, dp=1, pp=1, iterations=3,
              compute_time=ComputeTime("step", step_s))
    plan, step = _simulated_step(job)
    assert (plan.pp, plan.dp) == (1, 1)
    assert step == pytest.approx(step_s, rel=1e-9)


def test_a_step_is_shared_by_the_stages_in_proportion_to_their_flops() -> None:
    """Two stages compute what one would: their microbatches' compute adds up to the step,
    the last stage's share larger by the output layer's FLOPs."""
    job = Job(MODEL, microbatches=4, dp=1, pp=2, iterations=3,
              compute_time=ComputeTime("step", 1.0))
    topology = _topology(2)
    plan = plan_with_simulator(training_policy("gpipe"), topology, job)
    costs = stage_costs(topology, job, plan)
    assert plan.pp == 2
    assert sum(c.total_s for c in costs) * plan.microbatches == pytest.approx(1.0, rel=1e-12)
    assert costs[1].forward_s > costs[0].forward_s


def test_a_stated_layer_time_costs_each_layer_and_the_head_at_its_rate() -> None:
    layer_s = 0.01
    job = Job(MODEL, microbatches=2, dp=1, pp=1, iterations=3,
              compute_time=ComputeTime("layer", layer_s))
    topology = _topology(1)
    plan = plan_with_simulator(training_policy("gpipe"), topology, job)
    head = head_forward_flops(MODEL, 1) / layer_forward_flops(MODEL, 1)
    (cost,) = stage_costs(topology, job, plan)
    assert cost.total_s == pytest.approx((MODEL.layers + head) * layer_s, rel=1e-12)
    assert cost.backward_s == pytest.approx(2 * cost.forward_s)
    _, step = _simulated_step(job)
    assert step == pytest.approx(plan.microbatches * cost.total_s, rel=1e-9)


def test_the_plan_says_its_compute_is_the_job_s_measured_time() -> None:
    job = Job(MODEL, microbatches=4, dp=1, pp=1, compute_time=ComputeTime("step", 0.5))
    topology = _topology(1)
    plan = plan_with_simulator(training_policy("gpipe"), topology, job)
    text = "\n".join(describe_plan(plan, topology, job))
    assert "at the job's measured 500 ms per step" in text
    assert "modeled on" not in text


def test_the_section_reads_writes_and_takes_set() -> None:
    for section, expected in [({"step": "1.5s"}, ComputeTime("step", 1.5)),
                              ({"layer": "3ms"}, ComputeTime("layer", 0.003)),
                              ({"step": 2}, ComputeTime("step", 2.0))]:
        job = load_job({"model": "tiny", "compute_time": section}, "t.yaml")
        assert job.compute_time == expected
        assert parse_job(dump_job(job), prefix="") == job
    assert load_job({"model": "tiny"}, "t.yaml").compute_time is None
    assert load_job({"model": "tiny"}, "t.yaml", overrides=["compute_time.step=250ms"]) \
        .compute_time == ComputeTime("step", 0.25)


@pytest.mark.parametrize("section, message", [
    ({"step": 0}, "t.yaml: job.compute_time.step: must be above 0 and at most a day, got 0"),
    ({"layer": "-2ms"}, "t.yaml: job.compute_time.layer: must not be negative, got '-2ms'"),
    ({"step": "fast"}, "t.yaml: job.compute_time.step: expected a duration like '40ms', got "
                       "'fast'"),
    ({"step": "2 days"}, None),
    ({"step": 1e9}, "t.yaml: job.compute_time.step: must be above 0 and at most a day, "
                    "got 1000000000.0"),
    ({}, "t.yaml: job.compute_time: give one of step (a replica's whole step) or layer (one "
         "layer, one microbatch), not neither"),
    ({"step": 1, "layer": 1}, "t.yaml: job.compute_time: give one of step (a replica's whole "
                              "step) or layer (one layer, one microbatch), not step and layer"),
    ({"stpe": 1}, "t.yaml: job.compute_time.stpe: unknown key (did you mean 'step'?)"),
])
def test_a_bad_compute_time_is_one_line_naming_file_and_key(section: dict[str, Any],
                                                             message: str | None) -> None:
    with pytest.raises(InputError) as caught:
        load_job({"model": "tiny", "compute_time": section}, "t.yaml")
    text = str(caught.value)
    assert "\n" not in text
    if message is None:
        assert text.startswith("t.yaml: job.compute_time.step: ")
    else:
        assert text == message


def test_validate_names_the_file_and_key_and_exits_2(tmp_path: Path) -> None:
    topology = {"datacenters": [{"name": "east", "gpus": 1, "gpu": "a100"}], "wan": [],
                "job": {"model": "tiny", "compute_time": {"step": "-1s"}}}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(topology))
    code, _, err = call(["validate", str(path)])
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].endswith(f"{path}: job.compute_time.step: must not be negative, got '-1s'")


def test_dilation_stretches_a_measured_time_as_it_does_a_gpu_s_peak() -> None:
    job = Job(MODEL, compute_time=ComputeTime("layer", 0.02))
    assert dilate_job(job, 4).compute_time == ComputeTime("layer", 0.08)
    assert dilate_job(job, 1) is job


def test_emulated_workers_compute_for_the_simulator_s_times() -> None:
    job = Job(MODEL, microbatches=4, dp=1, pp=2, iterations=3,
              compute_time=ComputeTime("step", 0.6))
    topology = _topology(2)
    policy = training_policy("gpipe")
    plan = plan_with_simulator(policy, topology, job)
    run = RunConfig(topology, job, plan, policy, "emulated", Path("logs"))
    workers = [WorkerHandle(i, gpus[0], r, s) for i, ((r, s), gpus) in enumerate(plan.workers())]
    costs = stage_costs(topology, job, plan)
    for worker in workers:
        config = worker_config(run, worker, workers, lambda gpu: gpu, ())
        timing = config.emulated[str(worker.stage)]
        cost = costs[worker.stage]
        assert (timing.forward_s, timing.backward_s) == (cost.forward_s, cost.backward_s)
