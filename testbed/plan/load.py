"""A plan from a file, for `testbed plan --load` and a run's `--plan FILE`: a plan's own
CSV (testbed.plan.text: saved by `testbed plan --csv`, or edited by hand) or torch's CSV
form of a pipeline schedule (`_dump_csv`: one row of actions per rank), which becomes a
plan on the given topology and job as torch's runtime would run it. Either is validated
(a dry run) and must fit the job it runs with.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from testbed.errors import InputError, PlanError
from testbed.input_files import MAX_CSV_BYTES, read_input
from testbed.job import Job
from testbed.plan.build import Schedule, build_plan, file_order_placement
from testbed.plan.model import Plan
from testbed.plan.schedules import Sends
from testbed.plan.text import parse_plan_csv
from testbed.plan.torch_order import is_torch_csv, parse_torch_csv
from testbed.plan.validate import validate_plan
from testbed.sizes import MAX_MICROBATCHES
from testbed.topology.model import Topology
from testbed.units import plural


def load_plan(path: str | Path, topology: Topology, job: Job) -> Plan:
    """The plan in `path`, checked to run on `topology` with `job`; InputError naming the
    file and the problem otherwise."""
    source = str(path)
    text = read_input(path, MAX_CSV_BYTES)
    plan = torch_csv_plan(text, source, topology, job) if is_torch_csv(text) else \
        parse_plan_csv(text, source)
    try:
        validate_plan(plan, topology)
    except PlanError as exc:
        raise InputError(str(exc), source) from None
    if sum(plan.layers) != job.model.layers:
        raise InputError(f"the plan's stages hold {sum(plan.layers)} layers "
                         f"({' '.join(map(str, plan.layers))}), the job's model has "
                         f"{job.model.layers}", source, "meta layers")
    if plan.microbatch_size != job.microbatch_size:
        raise InputError(f"the plan's microbatches are of {plan.microbatch_size}, the job's "
                         f"of {job.microbatch_size}", source, "meta microbatch_size")
    return plan


def torch_csv_plan(text: str, source: str, topology: Topology, job: Job,
                   sends: Sends = Sends.TORCH) -> Plan:
    """torch's schedule as a plan: its compute order per rank, with the communication
    torch's runtime adds (testbed.plan.lowering); ranks are the topology's GPUs in file
    order (as the gpipe and 1f1b baselines place), a rank holding the stages its row
    runs, and as many replicas as fit (or the job's dp); the microbatches are the file's."""
    order = parse_torch_csv(text, source)
    held = {rank: order.stages_of(rank) for rank in range(order.ranks)}
    for rank, stages in held.items():
        if len(stages) != len(held[0]):
            raise InputError(f"rank {rank} runs {plural(len(stages), 'stage')}, rank 0 "
                             f"{len(held[0])}: every rank holds as many", source,
                             f"line {rank + 1}")
    microbatches = 1 + max((leaf.microbatch or 0) for actions in order.compute.values()
                           for a in actions for leaf in a.leaves)
    if microbatches > MAX_MICROBATCHES:
        raise InputError(f"microbatch {microbatches - 1} is past testbed's limit of "
                         f"{MAX_MICROBATCHES:,} microbatches", source)
    ranks = order.ranks
    dp = job.dp if job.dp is not None else topology.total_gpus // (ranks * job.tp)
    if dp < 1:
        raise InputError(f"{ranks} ranks x tp {job.tp} need {ranks * job.tp} GPUs, the "
                         f"topology has {topology.total_gpus}", source)
    gpus = file_order_placement(topology, dp, ranks, job.tp)
    placement = {(r, s): gpus[(r, rank)] for r in range(dp)
                 for s, rank in order.stage_rank.items()}
    sized = replace(job, microbatches=microbatches, global_batch=None)
    return build_plan(Schedule.TORCH_CSV.value, topology, sized, placement,
                      Schedule.TORCH_CSV, sends=sends, order=order,
                      notes={"loaded": f"torch's schedule CSV {Path(source).name}"})

