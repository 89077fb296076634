"""A plan from a file, for `testbed plan --load` and a run's `--plan FILE`: a plan's own
CSV (testbed.plan.text: saved by `testbed plan --csv`, or edited by hand) or torch's CSV
form of a pipeline schedule (`_dump_csv`: one row of actions per rank), which becomes a
plan on the given topology and job as torch's runtime would run it. Either is validated
(a dry run) and must fit the job it runs with.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from testbed.common.input_files import MAX_CSV_BYTES, read_input
from testbed.common.sizes import MAX_MICROBATCHES
from testbed.common.units import plural
from testbed.errors import InputError, PlanError
from testbed.job.model import Job
from testbed.plan.build import Schedule, build_plan, file_order_placement
from testbed.plan.compute import gpu_memory_bytes
from testbed.plan.host_limits import this_machine
from testbed.plan.model import Plan
from testbed.plan.schedules import Sends
from testbed.plan.text import parse_plan_csv
from testbed.plan.torch_order import is_torch_csv, parse_torch_csv
from testbed.plan.validate import validate_plan
from testbed.topology.model import Topology


def load_plan(path: str | Path, topology: Topology, job: Job) -> Plan:
    """The plan in `path`, checked to run on `topology` with `job`; InputError naming the
    file, the row where the problem is (the action list of the first GPU it names) and
    the problem otherwise."""
    source = str(path)
    text = read_input(path, MAX_CSV_BYTES)
    torch_form = is_torch_csv(text)
    plan = torch_csv_plan(text, source, topology, job) if torch_form else \
        parse_plan_csv(text, source)
    rows = _rank_rows(plan, topology) if torch_form else _action_rows(text)
    return check_given_plan(plan, topology, job, source, rows)


def given_plan(plan: str | Path | Plan, topology: Topology, job: Job
               ) -> tuple[Plan, str | None]:
    """A run's given plan, checked (`check_given_plan`), and the file it came from: a
    path is loaded (`load_plan`), a Plan (from the Python API) is checked as it is."""
    if isinstance(plan, Plan):
        return check_given_plan(plan, topology, job, f"the given plan of {plan.policy}"), None
    return load_plan(plan, topology, job), str(plan)


def check_given_plan(plan: Plan, topology: Topology, job: Job, source: str,
                     rows: Mapping[str, int] | None = None) -> Plan:
    """A plan not made by a policy (a file, a Plan handed to the Python API), validated and
    dry-run on `topology`, and checked against `job` (its layers, microbatch size, and
    every GPU's memory as the policies check it): InputError located at `source` (and the
    line of the first GPU the problem names, from `rows`: GPU -> line)."""
    try:
        validate_plan(plan, topology, this_machine())
    except PlanError as exc:
        raise InputError(str(exc), source, _row_named(str(exc), rows or {})) from None
    if sum(plan.layers) != job.model.layers:
        raise InputError(f"the plan's stages hold {sum(plan.layers)} layers "
                         f"({' '.join(map(str, plan.layers))}), the job's model has "
                         f"{job.model.layers}", source, "meta layers")
    if plan.microbatch_size != job.microbatch_size:
        raise InputError(f"the plan's microbatches are of {plan.microbatch_size}, the job's "
                         f"of {job.microbatch_size}", source, "meta microbatch_size")
    for gpu in plan.used_gpus():
        need = max(gpu_memory_bytes(job, plan.layers, plan.stages_of(gpu), plan.tp, program[gpu])
                   for program in plan.all_programs())
        has = topology.gpu(gpu).type
        if need > has.memory_bytes:
            raise InputError(f"{gpu} needs {need / 2**30:.1f} GiB for its stages' parameters, "
                             f"optimizer state and the activations its actions hold at once; "
                             f"it has {has.memory_bytes / 2**30:.0f} GiB ({has.name})", source,
                             _row_named(gpu, rows or {}))
    return plan


def _action_rows(text: str) -> dict[str, int]:
    """Each GPU's `actions` row in a plan's CSV, by line number."""
    rows: dict[str, int] = {}
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if len(row) > 1 and row[0] == "actions":
            rows.setdefault(row[1], number)
        elif len(row) > 2 and row[0] == "conn":  # named in a problem as "A and B"
            a, b = sorted(row[1:3])
            rows.setdefault(f"{a} and {b}", number)
    return rows


def _rank_rows(plan: Plan, topology: Topology) -> dict[str, int]:
    """Each GPU's row in torch's CSV form: its rank's (`torch_csv_plan` places ranks in
    file order)."""
    ranks = file_order_placement(topology, plan.dp, plan.gpus_per_pipeline, plan.tp)
    return {gpu: rank + 1 for (_, rank), gpus in ranks.items() for gpu in gpus}


def _row_named(problem: str, rows: Mapping[str, int]) -> str | None:
    """`line N (GPU)`: the row of the GPU the problem names first, if it names one."""
    named = [(match.start(), -len(gpu), gpu) for gpu in rows
             for match in [re.search(rf"(?<![\w-]){re.escape(gpu)}(?![\w-])", problem)]
             if match is not None]
    if not named:
        return None
    gpu = min(named)[2]  # the first named, the longest where two start there
    return f"line {rows[gpu]} ({gpu})"


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

