"""A short human summary of a plan: where stages live, what crosses the WAN, ideal bubbles."""

from __future__ import annotations

from testbed.common.codec import JsonObject
from testbed.common.units import human_bytes, human_duration, plural
from testbed.job.model import Job
from testbed.plan.activations import in_flight
from testbed.plan.collective import Reduces, Scope
from testbed.plan.compute import collective_bytes, stage_cost
from testbed.plan.ideal import ideal_bubble_fraction
from testbed.plan.model import Op, Plan
from testbed.plan.queue_mismatch import mismatches_text, queue_mismatches
from testbed.plan.text import format_cycle
from testbed.topology.model import Topology


def wan_crossings(plan: Plan, topology: Topology) -> int:
    """Stage boundaries that some replica's activations carry across the WAN."""
    return sum(
        1
        for s in range(plan.pp - 1)
        if any(
            topology.dc_of(plan.lead_gpu(r, s)) != topology.dc_of(plan.lead_gpu(r, s + 1))
            for r in range(plan.dp)
        )
    )


def allreduce_spans_wan(plan: Plan, topology: Topology) -> bool:
    """Whether some stage all-reduces its gradients with replicas in other DCs."""
    reduces_all = any(
        a.op.is_collective and a.subject.reduces is Reduces.GRADIENTS
        and a.subject.scope is Scope.ALL
        for program in plan.all_programs() for actions in program.values() for a in actions)
    return reduces_all and any(
        len({topology.dc_of(plan.lead_gpu(r, s)) for r in range(plan.dp)}) > 1
        for s in range(plan.pp)
    )


def cycle_lines(plan: Plan, job: Job) -> list[str]:
    """What a plan whose iterations differ does over one cycle, and what each sync moves."""
    if plan.period == 1 and not plan.has_outer_steps:
        return []
    lines = [f"  cycle of {plan.period} iterations (programs {format_cycle(plan.cycle)})"
             if plan.cycle else "  every iteration alike"]
    counts: dict[str, int] = {}
    sizes: dict[str, int] = {}
    for iteration in range(plan.period):
        for stage in range(plan.pp):
            for action in plan.steady_actions_at(iteration)[plan.lead_gpu(0, stage)]:
                if action.op in (Op.ALLREDUCE, Op.ALLREDUCE_START):
                    key = str(action.subject) or "grad"
                    counts[key] = counts.get(key, 0) + (stage == 0)
                    sizes[key] = sizes.get(key, 0) + (
                        collective_bytes(job, plan.layers, stage, action.subject, plan.tp)
                        * (iteration < plan.period))
    for key in sorted(counts):
        per_cycle = sizes[key] // max(1, counts[key])
        lines.append(f"  all-reduce [{key}]: {counts[key]} per cycle, "
                     f"{human_bytes(per_cycle)} from each replica each time")
    if plan.has_outer_steps:
        outer = plan.outer
        lines.append(f"  outer step: SGD lr {outer.lr}, momentum {outer.momentum}"
                     f"{' (Nesterov)' if outer.nesterov else ''}"
                     + (f", local parameters keep {outer.mixing:g} when a sync lands"
                        if outer.mixing else ""))
    return lines


def in_flight_line(plan: Plan) -> str:
    """Microbatches whose activations each GPU of replica 0 holds at most, by stage."""
    gpus = dict.fromkeys(gpus[0] for (r, _), gpus in plan.workers() if r == 0)
    held = [f"{gpu} " + " ".join(f"s{stage}:{count}" for stage, count in sorted(
        in_flight(plan.actions[gpu]).items())) for gpu in gpus]
    return f"  activations held at most (microbatches per stage): {', '.join(held)}"


def _costed(job: Job, gpu: str) -> str:
    measured = job.compute_time
    if measured is None:
        return f"modeled on {gpu}"
    return f"at the job's measured {human_duration(measured.seconds)} per {measured.per}"


def describe_plan(plan: Plan, topology: Topology, job: Job) -> list[str]:
    virtual = plan.stages_per_gpu
    pp = f"pp {plan.pp}" if virtual == 1 else \
        f"pp {plan.gpus_per_pipeline} (x {virtual} virtual stages = {plan.pp} stages)"
    lines = [
        f"policy {plan.policy}: dp {plan.dp} x {pp} x tp {plan.tp} = "
        f"{len(plan.used_gpus())} of {plural(topology.total_gpus, 'GPU')}, "
        f"{plural(plan.microbatches, 'microbatch', 'microbatches')} of {plan.microbatch_size} "
        "per replica",
    ]
    dcs = plan.stage_dcs(topology.dc_of)
    for stage in range(plan.pp):
        gpus = [g for r in range(plan.dp) for g in plan.gpus_of(r, stage)]
        gpu_type = topology.gpu(gpus[0]).type
        cost = stage_cost(job, plan.layers[stage], stage == 0, stage == plan.pp - 1, gpu_type,
                          plan.tp, plan.microbatches)
        lines.append(
            f"  stage {stage}: {plural(plan.layers[stage], 'layer')} in "
            f"{', '.join(sorted(dcs[stage]))} ({plural(len(gpus), 'GPU')}), forward "
            f"{human_duration(cost.forward_s)}, backward {human_duration(cost.backward_s)} "
            f"per microbatch ({_costed(job, gpu_type.name)})"
        )
    wan = [f"{a}->{b} {s.value}" for (a, b), s in sorted(plan.sharing.items())]
    reduce_note = "; gradient all-reduce crosses it" if allreduce_spans_wan(plan, topology) else ""
    lines.append(
        f"  WAN: {wan_crossings(plan, topology)} stage boundaries cross it{reduce_note}; "
        f"links used: {', '.join(wan) or 'none'}"
    )
    mismatched = mismatches_text(queue_mismatches(topology, plan))
    if mismatched is not None:
        lines.append(f"  WAN queues: {mismatched}")
    counts = sorted({n for n in plan.connections.values()})
    lines.append(
        f"  TCP connections per peer pair: {', '.join(map(str, counts)) or 'none'}; "
        f"activations {human_bytes(job.activation_bytes)} per microbatch"
    )
    lines.append(f"  ideal bubble fraction (equal stages, free messages) = "
                 f"{ideal_bubble_fraction(plan):.1%}")
    lines.append(in_flight_line(plan))
    lines += cycle_lines(plan, job)
    if plan.dp_cells:
        cells = "; ".join(",".join(map(str, c)) for c in plan.dp_cells)
        lines.append(f"  DP-cells (replicas taking turns on the WAN): {cells}")
    if plan.host_tcp:
        wanted = ", ".join(f"{k} {('on' if v else 'off') if isinstance(v, bool) else v}"
                           for k, v in plan.host_tcp.to_dict().items())
        lines.append(f"  host TCP settings the plan needs (applied by both backends): {wanted}")
    for key, value in plan.notes.items():
        if key == "dc_selection" and isinstance(value, dict):
            lines += _selection_lines(value)
        else:
            lines.append(f"  {key}: {value}")
    return lines


def _selection_lines(selection: JsonObject, shown: int = 6) -> list[str]:
    """A policy's candidate placements, best first, one line each: its `dc_selection`
    note, free-form as every note is (Plan.notes), so read key by key, any missing."""
    def line(c: JsonObject) -> str:
        stages = "/".join(str(n) for n in c.get("stages", []))
        cell = c.get("dp_cell")
        temporal = "temporal" if cell is None or cell == c.get("dp") else \
            f"temporal (cells of {cell})"
        mechanisms = [m for m, on in ((temporal, c.get("temporal")),
                                      ("multi-conn", c.get("multi_connection"))) if on]
        simulated = c.get("simulated_s")
        used = " ".join(mechanisms) or "no mechanisms"
        return (f"{', '.join(c.get('dcs', []))}: dp {c.get('dp')} x pp {c.get('pp')} "
                f"(stages per DC {stages}), {c.get('schedule')}, {used}; "
                + (f"simulated {'at least ' if c.get('at_least') else ''}{simulated:.2f} s"
                   if simulated is not None else
                   f"estimated {c.get('predicted_s', 0):.2f} s"))

    candidates = selection.get("candidates", [])
    out = [f"  DC selection chose {line(selection.get('chosen', {}))}",
           f"    why: {selection.get('why', '')}",
           f"    candidates ({len(candidates)}, best first):"]
    out += [f"      {line(c)}" for c in candidates[:shown]]
    if len(candidates) > shown:
        out.append(f"      ... {len(candidates) - shown} more in the plan's notes")
    return out
