"""The emulator's workers run torch's schedule language: several stages per GPU (an engine
each), split backwards (the input gradient first, the weights' later) and overlapped
units, with a message between two stages of one GPU handed over in memory. Stage runners
of whole plans over real transports on localhost, no namespaces (the same runs over the
emulated WAN: tests/test_torch_schedules_root.py)."""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch.autograd.graph import Node

from testbed.common.choices import EmulatedCompute
from testbed.emulator.runtime.coordinator.pool import WorkerHandle
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.emulator.runtime.coordinator.worker_setup import worker_config
from testbed.emulator.runtime.wire.messages import Config
from testbed.emulator.runtime.worker.compute.model import build_stages, loss_of
from testbed.emulator.runtime.worker.compute.reference import merge_stages, train_one_process
from testbed.emulator.runtime.worker.compute.split_backward import (
    _consumers,
    _consuming,
    input_gradient,
    weight_gradients,
)
from testbed.emulator.runtime.worker.stage_runner import StageRunner
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.job.model import Job
from testbed.plan.interpret import Compute, Overlapped, Part, Receive, Send, interpret
from testbed.plan.model import Plan
from testbed.policy import training_policy
from testbed.report.chrome import trace_events
from testbed.report.gantt import GanttPanel, gantt_plot
from tests.test_stage_runner import _run_configs

TWO_DC = Path(__file__).resolve().parent.parent / "topologies" / "two-dc.yaml"
SCHEDULES = ["interleaved-1f1b", "zb-v", "dualpipe-v"]


def _setup(policy: str, compute: EmulatedCompute, iterations: int
           ) -> tuple[Plan, Job, list[Config]]:
    """two-dc's job (a tiny model: a layer per stage) under `policy`: dp 2 x 2 GPUs, two
    stages each; every worker's Config as the coordinator makes it."""
    inputs = load_inputs(TWO_DC, sets=(f"iterations={iterations}",))
    chosen = training_policy(policy)
    plan = plan_with_simulator(chosen, inputs.topology, inputs.job)
    assert (plan.dp, plan.gpus_per_pipeline, plan.stages_per_gpu) == (2, 2, 2)
    run = RunConfig(inputs.topology, inputs.job, plan, chosen, compute, Path("logs"))
    workers = [WorkerHandle(n, gpu, *plan.worker_of(gpu), plan.stages_of(gpu))
               for n, gpu in enumerate(plan.used_gpus())]
    return plan, inputs.job, [worker_config(run, w, workers, lambda _gpu: "127.0.0.1", ())
                              for w in workers]


def _run(configs: list[Config], iterations: int) -> list[StageRunner]:
    runners, _ = asyncio.run(_run_configs(configs, iterations))
    return runners


@pytest.mark.parametrize("policy", SCHEDULES)
def test_real_compute_of_torchs_schedules_equals_one_process(policy: str) -> None:
    """Each stage its own module, optimizer and all-reduce; a split backward's halves
    accumulate into the same gradients as a whole one: the parameters are those of one
    process trained on the same samples (the pipeline parity test's standard)."""
    plan, job, configs = _setup(policy, "real", 3)
    runners = _run(configs, 3)
    reference = train_one_process(job, plan.dp, plan.microbatches)
    for replica in range(plan.dp):
        held = {stage: engine.module.state_dict() for runner in runners  # type: ignore[attr-defined]
                if runner.config.replica == replica
                for stage, engine in runner.engines.items()}
        trained = merge_stages([held[s] for s in range(plan.pp)], plan.layers)
        assert trained.keys() == reference.keys()
        for name, value in reference.items():
            torch.testing.assert_close(trained[name], value, atol=2e-5, rtol=1e-4,
                                       msg=f"{name} of replica {replica}")


@pytest.mark.parametrize("policy", SCHEDULES)
def test_emulated_workers_run_the_plans_computes_and_hand_local_messages_over(
        policy: str, tmp_path: Path) -> None:
    plan, job, configs = _setup(policy, "emulated", 2)
    runners = _run(configs, 2)
    spans = [s for runner in runners for s in runner.spans]
    start = min(s["start"] for s in spans)
    events = trace_events(spans, start, load_inputs(TWO_DC).topology)
    named = {e["name"] for e in events if e.get("cat") in ("forward", "backward")}
    assert named == {str(leaf) for actions in plan.actions.values() for action in actions
                     for leaf in action.leaves if leaf.op.is_compute}  # 3I0, 3W0, 2F1 ...
    placement = {f"{r},{s}": gpus for (r, s), gpus in plan.placement.items()}
    gantt_plot([GanttPanel(policy, spans, start, 1, placement)], tmp_path / "gantt.png")
    assert (tmp_path / "gantt.png").stat().st_size > 0
    for runner in runners:
        gpu, cfg = runner.config.gpu, runner.config
        steps = interpret(plan.actions[gpu], cfg.stages, plan.pp)
        computes = [c for step in steps for c in (
            step.parts if isinstance(step, Overlapped) else (step,) if isinstance(step, Compute)
            else ())]
        for iteration in range(2):
            spans = [s for s in runner.spans if s["iteration"] == iteration]
            ran = [(s["kind"], s["stage"], s.get("part"), s["microbatch"]) for s in spans
                   if s["kind"] in ("forward", "backward")]
            assert ran == [(c.phase.label, c.stage, None if c.part is Part.WHOLE else
                            c.part.value, c.microbatch) for c in computes]
            local = [s for s in steps if isinstance(s, Send | Receive) and s.local]
            remote = [s for s in steps if isinstance(s, Send) and not s.local]
            sent = [s for s in spans if s["kind"] == "send" and s["microbatch"] is not None]
            assert len(sent) == len(remote) and all(s["peer"] != gpu for s in sent)
            transfers = [s for s in spans if s["kind"] == "transfer" and s["tag"][0] in "FB"]
            assert all(s["src"] != gpu for s in transfers)
            handed = [s for s in spans if s["kind"] == "recv" and s["peer"] == gpu]
            assert len(handed) == sum(isinstance(s, Receive) for s in local)
            assert all(s["waited"] == 0 and s["end"] == s["start"] for s in handed)
            steps_taken = Counter(s["stage"] for s in spans if s["kind"] == "step")
            assert steps_taken == dict.fromkeys(cfg.stages, 1)
            rings = Counter(s["stage"] for s in spans if s["kind"] == "allreduce")
            assert rings == dict.fromkeys(cfg.stages, 1)
        assert not runner.handed  # every local message was taken
    wan = sum(s["bytes"] for r in runners for s in r.spans
              if s["kind"] == "transfer" and s["link"] and s["tag"][0] in "FB")
    crossing = sum(1 for gpu in plan.used_gpus() for step in interpret(
        plan.actions[gpu], plan.stages_of(gpu), plan.pp) if isinstance(step, Send)
        and not step.local and _dc(plan.lead_gpu(0, step.to_stage)) != _dc(gpu))
    assert wan == 2 * crossing * job.activation_bytes
    if policy == "zb-v":  # stages 1 and 2 share a GPU: their messages stay on it
        assert any(isinstance(s, Send) and s.local for s in interpret(
            plan.actions["west-0"], (1, 2), plan.pp))


def _dc(gpu: str) -> str:
    return gpu.rsplit("-", 1)[0]


@pytest.mark.parametrize(("index", "mlp"), [(1, "gelu"), (2, "swiglu"), (3, "gelu")])
def test_a_split_backward_equals_a_whole_one_and_redoes_none_of_the_input_path(
        index: int, mlp: str) -> None:
    """A middle and the last stage, three microbatches: the input gradients of the input
    pass and the weight gradients accumulated by the weight passes are bit for bit those
    of whole backwards in the same order; no weight gradient exists before the weight
    pass, and the weight pass runs no node of the input's path but where it starts."""
    job = load_inputs(TWO_DC).job
    shape = replace(job.model, mlp=mlp)
    whole = build_stages(shape, (1, 1, 1, 1), 0)[index]
    split = copy.deepcopy(whole)
    last = index == 3
    generator = torch.Generator().manual_seed(1)
    batches = [(torch.randn(2, shape.seq_len, shape.hidden, generator=generator),
                torch.randn(2, shape.seq_len, shape.hidden, generator=generator),
                torch.randint(shape.vocab, (2, shape.seq_len), generator=generator))
               for _ in range(3)]

    def output(module: torch.nn.Module, x: torch.Tensor, targets: torch.Tensor
               ) -> torch.Tensor:
        out: torch.Tensor = module(x)
        return loss_of(out, targets) if last else out

    expected = []
    for x, grad, targets in batches:
        x = x.clone().requires_grad_(True)
        output(whole, x, targets).backward(None if last else grad)  # type: ignore[no-untyped-call]
        expected.append(x.grad)
    held, ran = [], []
    for (x, grad, targets), want in zip(batches, expected, strict=True):
        x = x.clone().requires_grad_(True)
        out = output(split, x, targets)
        consumers = _consumers(out)
        path = _consuming(x.view_as(x).grad_fn.next_functions[0][0], consumers)  # type: ignore[union-attr]
        found, for_weights = input_gradient(out, None if last else grad, x, split.parameters())
        assert torch.equal(found, want)
        assert all(p.grad is None for p in split.parameters())
        joins = {j for g in for_weights.groups for j in g.joins}
        for node in path - joins:
            node.register_prehook(_recorder(ran, node))
        held.append(for_weights)
    for for_weights in held:
        weight_gradients(for_weights)
    assert ran == []
    for (name, a), b in zip(whole.named_parameters(), split.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name  # type: ignore[arg-type]


def _recorder(ran: list[Node], node: Node) -> object:
    def record(grads: object) -> None:
        ran.append(node)
    return record
