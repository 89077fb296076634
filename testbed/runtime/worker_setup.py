"""What each worker is told before training: its part of the plan (Config) and whom to
dial (Connect). Pure: from the run's configuration and where each worker listens."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from testbed.compute import ring_allreduce_s, stage_cost
from testbed.pacing import GRADIENTS, paced, pair_pacing_bytes_per_s
from testbed.plan.build import PIPELINE, communicating_pairs
from testbed.plan.model import Sharing
from testbed.runtime.decode import DECODE_PORT
from testbed.runtime.messages import (
    Config,
    Connect,
    DecodeAddress,
    EmulatedTiming,
    Outbound,
    PeerInfo,
)
from testbed.runtime.pool import WorkerHandle
from testbed.runtime.run_config import RunConfig

AddressOf = Callable[[str], str]


def worker_config(run: RunConfig, worker: WorkerHandle, workers: Sequence[WorkerHandle],
                  address_of: AddressOf, decode_dcs: tuple[str, ...]) -> Config:
    plan, job, topology = run.plan, run.job, run.topology
    index_of = {w.gpu: w.index for w in workers}
    dc = topology.dc_of(worker.gpu)

    def peer(gpu: str) -> PeerInfo:
        return PeerInfo(index_of[gpu], gpu, topology.dc_of(gpu))

    stage = worker.stage
    first, last = stage == 0, stage == plan.pp - 1
    cost = stage_cost(job, plan.layers[stage], first, last, topology.gpu(worker.gpu).type)
    checkpoints = run.checkpoints
    decode = None
    if decode_dcs:
        target = dc if dc in decode_dcs else decode_dcs[0]
        decode = DecodeAddress(address_of(f"{target}-decode"), DECODE_PORT)
    return Config(
        index=worker.index, gpu=worker.gpu, dc=dc, address=address_of(worker.gpu),
        replica=worker.replica, stage=stage,
        actions=[str(a) for a in plan.actions[worker.gpu]],
        prev=None if first else peer(plan.lead_gpu(worker.replica, stage - 1)),
        next=None if last else peer(plan.lead_gpu(worker.replica, stage + 1)),
        ring=[peer(plan.lead_gpu(r, stage)) for r in range(plan.dp)],
        arbitrated=[f"{a}>{b}" for (a, b), s in plan.sharing.items()
                    if s is Sharing.ARBITRATED],
        iterations=job.iterations, compute=run.compute, model=job.model,
        layers=list(plan.layers), seed=job.seed, dp=plan.dp, microbatches=plan.microbatches,
        microbatch_size=plan.microbatch_size, activation_bytes=job.activation_bytes,
        grad_bytes=cost.grad_bytes, emulated=EmulatedTiming(cost.forward_s, cost.backward_s),
        local_rank=worker.index, save_dir=str(run.save_dir) if run.save_dir else None,
        first_iteration=checkpoints.first_iteration if checkpoints else 0,
        restore_dir=checkpoints.restore_dir() if checkpoints else None,
        checkpoint_dir=str(checkpoints.directory) if checkpoints else None,
        checkpoint_every=checkpoints.every if checkpoints else 0,
        allreduce_modeled_s=modeled_allreduce(run, stage, cost.grad_bytes),
        stretch=run.dilation if run.compute == "real" else 1,
        intra_dc_bps=topology.dc(dc).bandwidth_bps
        if run.activations == "auto" and run.compute == "emulated" else None,
        bubbles=bool(decode_dcs), decode=decode,
        inference_model=job.inference.model if job.inference else None,
        data=job.data if run.compute == "real" else None,
    )


def modeled_allreduce(run: RunConfig, stage: int, grad_bytes: int) -> float | None:
    """Seconds for an intra-DC all-reduce that is modeled instead of sent, or None.

    With emulated compute a stage's gradients (GBs for large models) would have to
    cross Python on this machine at intra-DC rates it cannot reach; inside one DC the
    ring is modeled at the DC's bandwidth unless `allreduce` is "real". Rings that
    cross the WAN always move real bytes.
    """
    plan, topology = run.plan, run.topology
    if run.allreduce == "real" or run.compute == "real" or plan.dp < 2:
        return None
    dcs = {topology.dc_of(plan.lead_gpu(r, stage)) for r in range(plan.dp)}
    if len(dcs) != 1:
        return None
    dc = topology.dc(dcs.pop())
    return ring_allreduce_s(grad_bytes, plan.dp, dc.bandwidth_bps, dc.latency_s)


def worker_connections(run: RunConfig, worker: WorkerHandle,
                       workers: Sequence[WorkerHandle], address_of: AddressOf) -> Connect:
    """Who dials whom: the lower-indexed worker of each pair opens the connections."""
    plan = run.plan
    by_gpu = {w.gpu: w for w in workers}
    outbound: dict[str, Outbound] = {}
    inbound: dict[str, int] = {}
    pacing: dict[str, float] = {}
    for a, b, kind in communicating_pairs(plan.placement, plan.dp, plan.pp, 1):
        n = plan.connections_between(a, b)
        wa, wb = by_gpu[a], by_gpu[b]
        low, high = (wa, wb) if wa.index < wb.index else (wb, wa)
        rate = pacing_rate(run, a, b, n, kind)
        if rate and worker in (wa, wb):
            pacing[str((wb if worker is wa else wa).index)] = rate
        if worker is low:
            outbound[str(high.index)] = Outbound(address_of(high.gpu), high.port, n)
        elif worker is high:
            inbound[str(low.index)] = n
    return Connect(outbound, inbound, pacing)


def pacing_rate(run: RunConfig, a: str, b: str, connections: int, kind: str) -> float | None:
    """Bytes per second for each of a cross-DC pair's connections: together they leave
    at the path's rate, or None when unpaced (testbed.pacing)."""
    topology = run.topology
    dc_a, dc_b = topology.dc_of(a), topology.dc_of(b)
    largest = run.job.activation_bytes if kind == PIPELINE else GRADIENTS
    if not run.pacing or not paced(topology, dc_a, dc_b, largest):
        return None
    return pair_pacing_bytes_per_s(topology.bottleneck_bps(dc_a, dc_b), connections)
