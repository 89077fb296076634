"""An emulated run's memory: predicted from the plan before anything starts, refused in
one line with how to fit, and a process's peak as the kernel counts it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from testbed.emulator.runtime.coordinator.exits import peak_resident_bytes, resident_bytes
from testbed.emulator.runtime.coordinator.memory import (
    DELAY_LINE_BYTES,
    WORKER_BYTES,
    MemoryPlan,
    check_memory,
    predict_memory,
)
from testbed.errors import InputError
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.inference.memory import in_flight_of
from testbed.plan.compute import stage_params
from testbed.plan.model import Plan
from testbed.policy import training_policy
from testbed.topology import parse_topology

ROOT = Path(__file__).resolve().parent.parent
TWO_DC = ROOT / "topologies" / "two-dc.yaml"
GIB = 2**30


def _predict(policy: str, compute: str = "emulated", **sets: object) -> MemoryPlan:
    inputs = load_inputs(TWO_DC, sets=tuple(f"{k}={v}" for k, v in sets.items()))
    plan: Plan = plan_with_simulator(training_policy(policy), inputs.topology, inputs.job)
    return predict_memory(inputs.topology, inputs.job, plan, compute,  # type: ignore[arg-type]
                          coordinator_now=100 * 2**20)


def test_emulated_workers_hold_the_same_however_many_microbatches_are_in_flight() -> None:
    few, many = _predict("gpipe", microbatches=4), _predict("gpipe", microbatches=512)
    assert few.workers == many.workers == 4
    assert few.per_worker == many.per_worker == WORKER_BYTES["emulated"]
    assert few.payloads == many.payloads == 0  # sizes, not payloads
    # only the spans the coordinator keeps grow with the microbatches
    assert many.coordinator > few.coordinator


def test_real_compute_holds_every_microbatch_in_flight() -> None:
    """GPipe holds all of a stage's microbatches before the first backward, 1F1B at most
    the stages ahead (two here)."""
    gpipe = _predict("gpipe", "real", microbatches=16)
    one_f_one_b = _predict("1f1b", "real", microbatches=16)
    assert gpipe.payloads == 16 * gpipe.payload_per_microbatch > 0
    assert one_f_one_b.payloads < gpipe.payloads
    assert gpipe.per_worker > WORKER_BYTES["real"]  # the stage's weights and Adam


def test_a_gpu_holding_several_stages_is_one_worker_holding_what_its_stages_hold() -> None:
    """Interleaved 1F1B on two-dc: 2 replicas x 2 GPUs holding two stages (a layer) each.
    The emulator starts a worker per GPU, not per stage; with real compute a worker keeps
    the microbatches in flight of both its stages at its worst moment (in_flight_of), and
    its share of every stage's training state."""
    inputs = load_inputs(TWO_DC)
    plan = plan_with_simulator(training_policy("interleaved-1f1b"), inputs.topology,
                               inputs.job)
    assert (plan.dp, plan.pp, plan.stages_per_gpu, plan.layers) == (2, 4, 2, (1, 1, 1, 1))
    emulated = predict_memory(inputs.topology, inputs.job, plan, "emulated", 0)
    assert emulated.workers == 4 and emulated.payloads == 0
    real = predict_memory(inputs.topology, inputs.job, plan, "real", 0)
    assert real.workers == 4
    one = real.payload_per_microbatch // (plan.dp * plan.pp)  # the same for every stage
    assert real.payloads == one * sum(in_flight_of(plan, gpu) for gpu in plan.used_gpus())
    state = sum(stage_params(inputs.job.model, 1, stage == 0, stage == plan.pp - 1)
                for stage in range(plan.pp)) * plan.dp * 16
    assert real.per_worker == WORKER_BYTES["real"] + state // 4


def test_the_wan_holds_a_bandwidth_delay_product_and_a_queue_per_direction() -> None:
    topology = parse_topology({
        "datacenters": [{"name": "a", "gpus": 1}, {"name": "b", "gpus": 1}],
        "wan": [{"between": ["a", "b"], "latency": "50ms", "bandwidth": "1Gbit",
                 "queue": "4MiB"}]}, "t.yaml")
    inputs = load_inputs(TWO_DC)
    plan = plan_with_simulator(training_policy("1f1b"), inputs.topology, inputs.job)
    memory = predict_memory(topology, inputs.job, plan, "emulated", 0)
    assert memory.network == 2 * (int(1e9 / 8 * 0.05 + 4 * 2**20) + DELAY_LINE_BYTES)


def _plan(**fields: int) -> MemoryPlan:
    base = {"workers": 4, "per_worker": GIB, "payloads": 0, "payload_per_microbatch": 0,
            "network": 0, "coordinator": GIB // 2, "span_bytes_per_iteration": 0,
            "iterations": 10}
    compute = "real" if fields.pop("real", 0) else "emulated"
    return MemoryPlan(compute, **{**base, **fields})  # type: ignore[arg-type]


def test_a_run_that_fits_goes_on() -> None:
    check_memory(_plan(), 5 * GIB, "t.yaml")
    check_memory(_plan(), None, "t.yaml")  # no MemAvailable: nothing to judge by


@pytest.mark.parametrize(("fields", "advice"), [
    ({"real": 1, "per_worker": 2 * GIB}, "; try --compute emulated"),
    ({"payloads": 8 * GIB, "payload_per_microbatch": GIB},
     "; try 7 fewer microbatches in flight per stage (--microbatches, or a schedule that "
     "holds fewer, as 1F1B)"),
    ({"coordinator": 4 * GIB, "span_bytes_per_iteration": GIB // 2},
     "; try --iterations 6"),
    ({"per_worker": 2 * GIB}, "; use fewer GPUs, or `testbed simulate`"),
])
def test_a_run_that_does_not_fit_is_refused_in_one_line_saying_how_to_fit(
        fields: dict[str, int], advice: str) -> None:
    memory = _plan(**fields)
    with pytest.raises(InputError) as error:
        check_memory(memory, 6 * GIB, "t.yaml")
    message = str(error.value)
    assert error.value.exit_code == 2 and "\n" not in message
    assert message.startswith(f"t.yaml: datacenters: 4 workers with {memory.compute} compute "
                              "need about ")
    assert "this machine has 6.44 GB available (MemAvailable)" in message
    assert message.endswith(advice), message


def test_a_run_too_large_for_this_machine_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    """Through the command: 10,000 iterations of 1,024 microbatches would have the
    coordinator keep hundreds of GB of spans."""
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-c", "from testbed.cli.main import main; main()", "up", str(TWO_DC),
         "--compute", "emulated", "--iterations", "10000", "--microbatches", "1024",
         "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "need about" in lines[0] and "try --iterations " in lines[0]
    assert not out.exists()


def test_a_processs_peak_is_what_it_once_held_not_what_it_holds() -> None:
    grows = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\n"
         "block = bytearray(256 * 2**20)\ndel block\n"
         "print('freed', flush=True)\ntime.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        assert grows.stdout is not None and grows.stdout.readline() == "freed\n"
        peak, now = peak_resident_bytes(grows.pid), resident_bytes(grows.pid)
        assert peak is not None and now is not None
        assert peak >= 256 * 2**20 > now
    finally:
        grows.kill()
        grows.wait()
    assert peak_resident_bytes(grows.pid) is None  # gone
