"""What each worker is told before training: its part of the plan (Config) and whom to
dial (Connect). Pure: from the run's configuration and where each worker listens."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from testbed.emulator.runtime.coordinator.pool import WorkerHandle
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.emulator.runtime.wire.messages import (
    CollectiveSetup,
    Config,
    Connect,
    DecodeAddress,
    EmulatedTiming,
    Outbound,
    PeerInfo,
)
from testbed.emulator.runtime.worker.decode import DECODE_PORT
from testbed.plan.build import ALLREDUCE, PIPELINE, LinkKind, communicating_pairs
from testbed.plan.collective import Collective, Scope
from testbed.plan.compute import collective_bytes, ring_allgather_s, ring_allreduce_s, stage_cost
from testbed.plan.model import Op, Plan, Sharing
from testbed.plan.pacing import GRADIENTS, paced, pair_pacing_bytes_per_s
from testbed.scenario.slowdowns import slowdowns_for

AddressOf = Callable[[str], str]


def worker_config(run: RunConfig, worker: WorkerHandle, workers: Sequence[WorkerHandle],
                  address_of: AddressOf, decode_dcs: tuple[str, ...]) -> Config:
    plan, job, topology = run.plan, run.job, run.topology
    index_of = {w.gpu: w.index for w in workers}
    dc = topology.dc_of(worker.gpu)

    def peer(gpu: str) -> PeerInfo:
        return PeerInfo(index_of[gpu], gpu, topology.dc_of(gpu))

    stages = plan.stages_of(worker.gpu)
    gpu_type = topology.gpu(worker.gpu).type
    costs = {s: stage_cost(job, plan.layers[s], s == 0, s == plan.pp - 1, gpu_type,
                           microbatches=plan.microbatches) for s in stages}
    neighbours = {str(s): peer(plan.lead_gpu(worker.replica, s)) for held in stages
                  for s in (held - 1, held + 1) if 0 <= s < plan.pp and s not in stages}
    checkpoints = run.checkpoints
    decode = None
    if decode_dcs:
        target = dc if dc in decode_dcs else decode_dcs[0]
        decode = DecodeAddress(address_of(f"{target}-decode"), DECODE_PORT)
    programs, cycle, opening = gpu_programs(plan, worker.gpu)
    collectives = [
        CollectiveSetup(stage, str(c), collective_bytes(job, plan.layers, stage, c, plan.tp),
                        [peer(plan.lead_gpu(r, stage)) for r in members],
                        modeled_collective(run, stage, c, members))
        for stage, c, members in gpu_collectives(run, worker.gpu)]
    return Config(
        index=worker.index, gpu=worker.gpu, dc=dc, address=address_of(worker.gpu),
        replica=worker.replica, stages=list(stages), programs=programs, cycle=cycle,
        opening=opening, arbitrated_syncs=plan.sync_order.arbitrated,
        neighbours=neighbours, collectives=collectives,
        arbitrated=[f"{a}>{b}" for (a, b), s in plan.sharing.items()
                    if s is Sharing.ARBITRATED],
        iterations=job.iterations, compute=run.compute, model=job.model,
        layers=list(plan.layers), seed=job.seed, dp=plan.dp, microbatches=plan.microbatches,
        microbatch_size=plan.microbatch_size, activation_bytes=job.activation_bytes,
        emulated={str(s): EmulatedTiming(c.forward_s, c.backward_s, c.input_s, c.weight_s)
                  for s, c in costs.items()},
        local_rank=worker.index, save_dir=str(run.save_dir) if run.save_dir else None,
        first_iteration=checkpoints.first_iteration if checkpoints else 0,
        restore_dir=checkpoints.restore_dir() if checkpoints else None,
        checkpoint_dir=str(checkpoints.directory) if checkpoints else None,
        checkpoint_every=checkpoints.every if checkpoints else 0,
        stretch=run.dilation if run.compute == "real" else 1,
        intra_dc_bps=topology.dc(dc).bandwidth_bps
        if run.activations == "auto" and run.compute == "emulated" else None,
        bubbles=bool(decode_dcs), decode=decode,
        inference_model=job.inference.model if job.inference else None,
        data=job.data if run.compute == "real" else None,
        optimizer=job.optimizer,
        outer=plan.outer if plan.has_outer_steps else None,
        keeps_outer_model=plan.keeps_outer_model,
        slowdowns=slowdowns_for(run.stragglers, [worker.gpu], dc),
    )


def gpu_programs(plan: Plan, gpu: str) -> tuple[list[list[str]], list[int], list[int]]:
    """`gpu`'s distinct programs, once each, and the cycle and the opening cycle as
    indices into them."""
    texts: list[list[str]] = []
    index: dict[tuple[str, ...], int] = {}
    of_program = []
    for program in plan.all_programs():
        actions = tuple(str(a) for a in program[gpu])
        if actions not in index:
            index[actions] = len(texts)
            texts.append(list(actions))
        of_program.append(index[actions])
    return (texts, [of_program[index] for index in plan.cycle],
            [of_program[index] for index in plan.opening])


def gpu_collectives(run: RunConfig, gpu: str) -> list[tuple[int, Collective, list[int]]]:
    """Every collective `gpu`'s programs join (an OUTER_STEP moves nothing), by the stage
    whose gradients or deltas it reduces, with the replicas that meet in it."""
    plan = run.plan
    replica, _ = plan.worker_of(gpu)
    joined = sorted({(a.stage, a.subject) for program in plan.all_programs()
                     for a in program[gpu] if a.op.is_collective and a.op is not Op.OUTER_STEP})
    return [(stage, c, group_of(run, replica, stage, c.scope)) for stage, c in joined]


def group_of(run: RunConfig, replica: int, stage: int, scope: Scope) -> list[int]:
    """The replicas of `stage` that reduce with `replica`: all of them, or those whose
    stage runs in its datacenter."""
    plan, dc_of = run.plan, run.topology.dc_of
    if scope is Scope.ALL:
        return list(range(plan.dp))
    mine = dc_of(plan.lead_gpu(replica, stage))
    return [r for r in range(plan.dp) if dc_of(plan.lead_gpu(r, stage)) == mine]


def modeled_collective(run: RunConfig, stage: int, collective: Collective,
                       members: list[int]) -> float | None:
    """Seconds for an intra-DC collective that is modeled instead of sent, or None.

    With emulated compute a stage's gradients (GBs for large models) would have to
    cross Python on this machine at intra-DC rates it cannot reach; inside one DC the
    ring is modeled at the DC's bandwidth unless `allreduce` is "real". Rings that
    cross the WAN always move real bytes.
    """
    plan, topology = run.plan, run.topology
    if run.allreduce == "real" or run.compute == "real" or len(members) < 2:
        return None
    dcs = {topology.dc_of(plan.lead_gpu(r, stage)) for r in members}
    if len(dcs) != 1:
        return None
    dc = topology.dc(dcs.pop())
    nbytes = collective_bytes(run.job, plan.layers, stage, collective, plan.tp)
    closed_form = ring_allgather_s if collective.gathers else ring_allreduce_s
    return closed_form(nbytes, len(members), dc.bandwidth_bps, dc.latency_s)


def ring_pairs(run: RunConfig) -> list[tuple[str, str, LinkKind]]:
    """Every pair of GPUs that are neighbours in some collective's ring."""
    plan = run.plan
    pairs = []
    for gpu in plan.used_gpus():
        replica, _ = plan.worker_of(gpu)
        for stage, _, members in gpu_collectives(run, gpu):
            if len(members) > 1:
                successor = members[(members.index(replica) + 1) % len(members)]
                pairs.append((gpu, plan.lead_gpu(successor, stage), ALLREDUCE))
    return pairs


def worker_connections(run: RunConfig, worker: WorkerHandle,
                       workers: Sequence[WorkerHandle], address_of: AddressOf) -> Connect:
    """Who dials whom: the lower-indexed worker of each pair opens the connections."""
    plan = run.plan
    by_gpu = {w.gpu: w for w in workers}
    outbound: dict[str, Outbound] = {}
    inbound: dict[str, int] = {}
    pacing: dict[str, float] = {}
    seen: set[frozenset[str]] = set()
    for a, b, kind in [*communicating_pairs(plan.placement, plan.dp, plan.pp, 1),
                       *ring_pairs(run)]:
        if frozenset((a, b)) in seen:
            continue
        seen.add(frozenset((a, b)))
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
    at the path's rate, or None when unpaced (testbed.plan.pacing)."""
    topology = run.topology
    dc_a, dc_b = topology.dc_of(a), topology.dc_of(b)
    largest = run.job.activation_bytes if kind == PIPELINE else GRADIENTS
    if not run.pacing or not paced(topology, dc_a, dc_b, largest):
        return None
    return pair_pacing_bytes_per_s(topology.bottleneck_bps(dc_a, dc_b), connections)
