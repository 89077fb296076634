"""Every claim at every set of conditions by one backend: the runs it asks for, then its
figure, as one ClaimRecord per (claim, conditions); the records from an earlier
invocation with the other backend are kept, so the two columns fill in turn."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from testbed.common.fsutil import own_directory
from testbed.common.progress import Counting, unseen
from testbed.common.units import format_rate, plural
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import shared_cache
from testbed.figures.claim_runs import BackendFigures, measure_claim
from testbed.figures.claims import Backend, ClaimSpec, Conditions, claims
from testbed.figures.frontier import UpTo
from testbed.figures.measure import Runner, Say
from testbed.figures.why import why
from testbed.topology.model import Topology


class ClaimRecord(TypedDict):
    """One entry of claims.json."""

    id: str
    claim: str
    paper: str
    unit: str
    target: float | None
    at_most: bool
    simulate: float | None
    emulate: float | None
    conditions: str
    """The topology file; its comments source every value."""
    conditions_summary: str
    command: str
    not_run: dict[str, str]
    """Why a backend's value is null."""
    detail: dict[str, BackendFigures]
    why: str | None
    """What bounds the figure at these conditions, from the simulated runs (the emulated
    where there are none): testbed.figures.why."""
    up_to: UpTo | None
    """The largest figure a search of the design space found, and where (the simulator;
    testbed.figures.frontier); None until one has run."""


@dataclass(frozen=True)
class Measurement:
    spec: ClaimSpec
    conditions: Conditions
    figures: BackendFigures


def summarize_conditions(topology: Topology) -> str:
    dcs = topology.datacenters
    sizes = sorted({f"{dc.gpus} x {dc.gpu.name}" for dc in dcs})
    latency = sorted(link.latency_s * 1e3 for link in topology.links)
    rates = sorted({format_rate(link.bandwidth_bps) for link in topology.links})
    tcp = topology.tcp
    return (f"{len(dcs)} DCs of {', '.join(sizes)}; WAN one-way {latency[0]:g}-{latency[-1]:g}"
            f" ms at {', '.join(rates)}; TCP {tcp.congestion}, wmem max "
            f"{tcp.wmem[2] / 2**20:g} MiB, slow start after idle "
            f"{'on' if tcp.slow_start_after_idle else 'off'}")


def measure(conditions: Sequence[Conditions], backend: Backend, only: set[str] | None,
            directory: Path, say: Say, wall_budget_s: float | None = None,
            detail: Say = lambda _m: None, count: Counting = unseen) -> list[Measurement]:
    """Every wanted claim at every set of conditions, each claim a step of `count`; `say`:
    a line as each run starts, `detail`: the runs' own lines."""
    todo = []
    for cond in conditions:
        inputs = load_inputs(Path(cond.topology))
        todo.append((cond, inputs, [spec for spec in claims(inputs.topology, inputs.job, cond)
                                    if only is None or spec.id in only]))
    total = sum(len(specs) for _, _, specs in todo)
    out: list[Measurement] = []
    with count(f"{backend}: {plural(total, 'claim')}", total, "claim") as steps:
        for cond, inputs, specs in todo:
            name = inputs.topology.name
            runner = Runner(inputs, backend, own_directory(directory, name, backend), say,
                            wall_budget_s, detail)
            with shared_cache():
                for spec in specs:
                    step = f"{spec.id} on {name}"
                    steps.start(step)
                    out.append(Measurement(spec, cond, measure_claim(runner, spec)))
                    steps.finish(step)
    return out


def records(measured: Sequence[Measurement], backend: Backend,
            earlier: Sequence[ClaimRecord]) -> list[ClaimRecord]:
    """This backend's measurements merged into the earlier records (same id)."""
    by_id: dict[str, ClaimRecord] = {r["id"]: r for r in earlier}
    other: Backend = "emulate" if backend == "simulate" else "simulate"
    for m in measured:
        topology_name = Path(m.conditions.topology).stem
        rid = f"{m.spec.id}:{topology_name}"
        old = by_id.get(rid)
        detail = dict(old["detail"]) if old else {}
        detail[backend] = m.figures
        not_run = {k: v for k, v in (old["not_run"] if old else {}).items() if k != backend}
        if old is None or (old.get(other) is None and other not in detail):
            not_run.setdefault(other, f"not run: `testbed figures --backend {other}` fills it")
        if m.figures.get("value") is None:
            not_run[backend] = m.figures.get("why_none", "no value")
        by_id[rid] = ClaimRecord(
            id=rid, claim=m.spec.claim, paper=m.spec.paper, unit=m.spec.unit,
            target=m.spec.target, at_most=m.spec.at_most,
            simulate=_value(detail, "simulate"), emulate=_value(detail, "emulate"),
            conditions=m.conditions.topology, conditions_summary=m.conditions.summary,
            command=f"testbed figures --backend {{simulate|emulate}} --claims {m.spec.id} "
                    f"--conditions {m.conditions.topology}",
            not_run=not_run, detail=detail, why=_why(m.spec.id, detail, m.spec.target),
            up_to=old.get("up_to") if old else None)
    return list(by_id.values())


def _why(claim_id: str, detail: Mapping[str, BackendFigures], target: float | None
         ) -> str | None:
    for backend in ("simulate", "emulate"):
        figures = detail.get(backend)
        if figures is not None and figures.get("value") is not None:
            return why(claim_id, figures.get("runs", {}), target)
    return None


def with_frontiers(saved: Sequence[ClaimRecord], found: Mapping[tuple[str, str], UpTo]
                   ) -> list[ClaimRecord]:
    """Records with the `up_to` a search found for their (claim, conditions file); the
    stated conditions are a point of the space too, where their figure is the larger."""
    out = []
    for record in saved:
        key = (record["id"].partition(":")[0], record["conditions"])
        if key not in found:
            out.append(record)
            continue
        up_to, here = found[key], record["simulate"]
        if here is not None and (up_to["value"] is None or here > up_to["value"]):
            reached = None if record["target"] is None else (
                here <= record["target"] if record["at_most"] else here >= record["target"])
            up_to = UpTo(value=here, conditions=f"the stated conditions ({record['conditions']})",
                         point={}, reached=reached, why=record["why"],
                         points=up_to["points"], search=up_to["search"])
        out.append(ClaimRecord(**{**record, "up_to": up_to}))
    return out


def _value(detail: Mapping[str, BackendFigures], backend: Backend) -> float | None:
    figures = detail.get(backend)
    return None if figures is None else figures.get("value")
