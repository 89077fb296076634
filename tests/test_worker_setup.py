"""What each worker is told of a plan whose iterations differ: its programs once each and
the cycle as indices, every collective it joins with its group, bytes and (inside a DC,
emulated) modeled time, and connections to every neighbour of every ring."""

from __future__ import annotations

from pathlib import Path

from testbed.emulator.runtime.coordinator.pool import WorkerHandle
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.emulator.runtime.coordinator.worker_setup import worker_config, worker_connections
from testbed.job.model import Job, ModelShape
from testbed.plan import validate_plan
from testbed.plan.build import Schedule, build_plan
from testbed.plan.collective import Collective, Reduces, Scope
from testbed.plan.compute import collective_bytes, ring_allgather_s
from testbed.plan.cycles import cycled
from testbed.plan.model import Action, Op, OuterOptimizer, Plan
from testbed.policy import training_policy
from testbed.topology import load_topology
from tests.conftest import TOPOLOGIES

PAPER = load_topology(TOPOLOGIES / "paper-3dc.yaml")
JOB = Job(model=ModelShape(layers=8, hidden=64, heads=4, seq_len=32, vocab=256), microbatches=4)
DC_GRADS = Collective(scope=Scope.DC, payload="int8")
DELTAS = Collective(Reduces.DELTAS, payload="int4")


def _plan() -> Plan:
    """Six replicas of two stages, replica r in the (r mod 3)-th DC: two per DC, reducing
    gradients inside their DC every step and their deltas across all DCs every third
    step."""
    placement = {}
    for replica in range(6):
        hosts = PAPER.datacenters[replica % 3].host_names()
        for stage in range(2):
            placement[(replica, stage)] = (hosts[(replica // 3) * 2 + stage],)
    inner = build_plan("test", PAPER, JOB, placement, Schedule.ONE_F_ONE_B, gradients=DC_GRADS)
    plan = cycled(inner, [lambda s: [], lambda s: [],
                          lambda s: [Action(s, Op.ALLREDUCE, None, DELTAS),
                                     Action(s, Op.OUTER_STEP)]], OuterOptimizer(lr=0.5))
    validate_plan(plan, PAPER)
    return plan


def _setup() -> tuple[RunConfig, list[WorkerHandle]]:
    plan = _plan()
    run = RunConfig(PAPER, JOB, plan, training_policy("1f1b"), "emulated", Path("logs"))
    workers = [WorkerHandle(i, gpus[0], r, s) for i, ((r, s), gpus) in enumerate(plan.workers())]
    return run, workers


def test_a_worker_gets_its_programs_once_and_the_cycle() -> None:
    run, workers = _setup()
    config = worker_config(run, workers[0], workers, lambda gpu: gpu, ())
    plan = run.plan
    assert config.cycle == [0, 0, 1] and len(config.programs) == 2
    gpu = workers[0].gpu
    assert [config.programs[config.program_of(n)] for n in range(6)] == \
        [[str(a) for a in plan.actions_at(n)[gpu]] for n in range(6)]
    assert config.outer == OuterOptimizer(lr=0.5) and config.period == 3


def test_each_collective_names_its_group_bytes_and_modeled_time() -> None:
    run, workers = _setup()
    plan = run.plan
    worker = workers[0]
    config = worker_config(run, worker, workers, lambda gpu: gpu, ())
    by_text = {c.collective: c for c in config.collectives}
    assert set(by_text) == {"int8,dc", "delta,int4"}
    grads, deltas = by_text["int8,dc"], by_text["delta,int4"]
    assert [p.gpu for p in grads.group] == [plan.lead_gpu(r, 0) for r in (0, 3)]
    assert [p.gpu for p in deltas.group] == [plan.lead_gpu(r, 0) for r in range(6)]
    assert grads.nbytes == collective_bytes(JOB, plan.layers, 0, DC_GRADS)
    assert deltas.nbytes == collective_bytes(JOB, plan.layers, 0, DELTAS) < grads.nbytes
    dc = PAPER.dc(PAPER.dc_of(worker.gpu))
    # compressed gradients are gathered, each member's payload compressed once
    assert grads.modeled_s == ring_allgather_s(grads.nbytes, 2, dc.bandwidth_bps, dc.latency_s)
    assert deltas.modeled_s is None  # it crosses the WAN: real bytes


def test_every_ring_neighbour_is_connected() -> None:
    run, workers = _setup()
    plan = run.plan
    by_gpu = {w.gpu: w for w in workers}
    first, fourth = by_gpu[plan.lead_gpu(0, 0)], by_gpu[plan.lead_gpu(3, 0)]
    connect = worker_connections(run, first, workers, lambda gpu: gpu)
    assert str(fourth.index) in connect.outbound  # a DC's ring: replicas 0 and 3
    accepted = worker_connections(run, fourth, workers, lambda gpu: gpu)
    assert accepted.inbound[str(first.index)] >= 1
