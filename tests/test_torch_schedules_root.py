"""torch's multi-stage schedules on real workers over the emulated WAN: with real compute
interleaved 1F1B, ZB-V and DualPipeV end with the parameters of one process; with emulated
compute each runs its plan's computes, names their stages and parts, and keeps the
messages between two stages of one GPU off the network. Needs root (CI runs as root)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import torch

from testbed.common.choices import EmulatedCompute
from testbed.emulator.runtime.coordinator.coordinator import Coordinator, RunOutcome
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.emulator.runtime.coordinator.signals import run_with_signals
from testbed.emulator.runtime.worker.compute.reference import merge_stages, train_one_process
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.plan.host_tcp import hosts_as_planned
from testbed.plan.interpret import Compute, Overlapped, Send, interpret
from testbed.policy import training_policy

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("clean_host")]
TWO_DC = Path(__file__).resolve().parent.parent / "topologies" / "two-dc.yaml"
SCHEDULES = ["interleaved-1f1b", "zb-v", "dualpipe-v"]


def _run(tmp: Path, policy: str, compute: EmulatedCompute, iterations: int
         ) -> tuple[Coordinator, RunOutcome]:
    """two-dc's job (a tiny model, a layer per stage): dp 2 x 2 GPUs of two stages each."""
    inputs = load_inputs(TWO_DC, sets=(f"iterations={iterations}",))
    chosen = training_policy(policy)
    plan = plan_with_simulator(chosen, inputs.topology, inputs.job)
    assert (plan.dp, plan.gpus_per_pipeline, plan.stages_per_gpu) == (2, 2, 2)
    config = RunConfig(hosts_as_planned(inputs.topology, plan), inputs.job, plan, chosen,
                       compute, tmp / "logs", stall_timeout_s=60, save_dir=tmp)
    coordinator = Coordinator(config, say=lambda _m: None)
    outcome = asyncio.run(run_with_signals(coordinator))
    assert outcome.status == "ok", outcome.error
    return coordinator, outcome


@pytest.mark.parametrize("policy", [
    # DualPipeV has virtual stages and a split backward both; the others, one each
    *(pytest.param(p, marks=pytest.mark.benchmark) for p in SCHEDULES[:2]), SCHEDULES[2]])
def test_torchs_schedules_with_real_compute_equal_one_process(tmp_path: Path,
                                                             policy: str) -> None:
    coordinator, outcome = _run(tmp_path, policy, "real", 3)
    plan, job = coordinator.plan, coordinator.job
    reference = train_one_process(job, plan.dp, plan.microbatches)
    for replica in range(plan.dp):
        stages = [torch.load(tmp_path / f"r{replica}-s{s}.pt") for s in range(plan.pp)]
        trained = merge_stages(stages, plan.layers)
        assert trained.keys() == reference.keys()
        for name, value in reference.items():
            torch.testing.assert_close(
                trained[name], value, atol=2e-5, rtol=1e-4, msg=f"{name} of replica {replica}")
    assert sorted(outcome.losses) == [0, 1, 2]


@pytest.mark.parametrize("policy", SCHEDULES)
def test_torchs_schedules_run_emulated_and_local_messages_stay_on_the_gpu(
        tmp_path: Path, policy: str) -> None:
    coordinator, outcome = _run(tmp_path, policy, "emulated", 2)
    plan, job = coordinator.plan, coordinator.job
    dc_of = coordinator.topology.dc_of
    crossing = 0
    for gpu in plan.used_gpus():
        steps = interpret(plan.actions[gpu], plan.stages_of(gpu), plan.pp)
        planned = [(c.phase.label, c.stage, c.part.value or None, c.microbatch)
                   for step in steps if isinstance(step, Compute | Overlapped)
                   for c in (step.parts if isinstance(step, Overlapped) else (step,))]
        for iteration in range(2):
            ran = [(s["kind"], s["stage"], s.get("part"), s.get("microbatch"))
                   for s in _of(outcome.spans, gpu, iteration, "forward", "backward")]
            assert ran == planned
        crossing += sum(isinstance(s, Send) and not s.local
                        and dc_of(plan.lead_gpu(0, s.to_stage)) != dc_of(gpu) for s in steps)
    parts = {s.get("part") for s in outcome.spans if s["kind"] == "backward"}
    assert parts == ({None} if policy == "interleaved-1f1b" else {None, "I", "W"}
                     if policy == "dualpipe-v" else {"I", "W"})
    pipeline = [s for s in outcome.spans
                if s["kind"] in ("send", "transfer") and s.get("microbatch") is not None]
    assert all(s["peer"] != s["gpu"] for s in pipeline)  # a local message moves nothing
    wan = sum(s["bytes"] for s in pipeline if s["kind"] == "transfer" and s["link"])
    assert wan == 2 * crossing * job.activation_bytes


def _of(spans: list[Any], gpu: str, iteration: int, *kinds: str) -> list[Any]:
    return [s for s in spans if s["gpu"] == gpu and s["iteration"] == iteration
            and s["kind"] in kinds]
