"""Every claim at every set of conditions by one backend: the runs it asks for, then its
figure, as one ClaimRecord per (claim, conditions); the records from an earlier
invocation with the other backend are kept, so the two columns fill in turn."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from testbed.errors import TestbedError
from testbed.figures.claims import (
    MULTI_TCP,
    Backend,
    ClaimSpec,
    Conditions,
    RunFigures,
    TransferFigures,
    claims,
    multi_tcp_link,
)
from testbed.figures.measure import Runner, Say, transfer, wan_connections
from testbed.inputs import load_inputs
from testbed.policy import training_policy
from testbed.sim.planning import plan_with_simulator, shared_cache
from testbed.topology.model import Topology
from testbed.units import format_rate


class BackendFigures(TypedDict, total=False):
    value: float | None
    runs: dict[str, dict[str, Any]]
    """Each run's figures (or its error) by its key in the claim."""
    why_none: str


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
            directory: Path, say: Say, wall_budget_s: float | None = None
            ) -> list[Measurement]:
    out: list[Measurement] = []
    for cond in conditions:
        inputs = load_inputs(Path(cond.topology))
        name = inputs.topology.name
        runner = Runner(inputs, backend, directory / name / backend, say, wall_budget_s)
        with shared_cache():
            for spec in claims(inputs.topology, inputs.job, cond):
                if only is not None and spec.id not in only:
                    continue
                if spec.id == MULTI_TCP:
                    figures = _multi_tcp(runner, inputs.topology, backend, say)
                else:
                    figures = _from_runs(runner, spec)
                out.append(Measurement(spec, cond, figures))
    return out


def _from_runs(runner: Runner, spec: ClaimSpec) -> BackendFigures:
    measured: dict[str, RunFigures] = {}
    runs: dict[str, dict[str, Any]] = {}
    for ask in spec.runs:
        got = runner.figures(ask)
        if isinstance(got, str):
            runs[ask.key] = {"run": ask.label(), "error": got}
            return {"value": None, "runs": runs, "why_none": f"{ask.label()} failed: {got}"}
        measured[ask.key] = got
        runs[ask.key] = {"run": ask.label(), **_as_dict(got)}
    value = spec.value(measured)
    figures: BackendFigures = {"value": value, "runs": runs}
    if value is None:
        figures["why_none"] = "a run measured no iteration"
    return figures


def _multi_tcp(runner: Runner, topology: Topology, backend: Backend, say: Say) -> BackendFigures:
    """Over the link Atlas's plan opens most connections on: its plan, not a run of it."""
    try:
        plan = plan_with_simulator(training_policy("atlas"), topology, runner.inputs.job)
    except TestbedError as exc:
        return {"value": None, "runs": {}, "why_none": f"atlas cannot plan: {exc}"}
    chosen = multi_tcp_link(topology, wan_connections(plan.summary()["connections"]))
    if chosen is None:
        return {"value": None, "runs": {}, "why_none": "Atlas's plan crosses no WAN link"}
    link, connections = chosen
    got = transfer(topology, link, runner.inputs.job.activation_bytes, connections, backend,
                   say)
    return {"value": got.one_s / got.many_s, "runs": {"transfer": _transfer_dict(got)}}


def _as_dict(figures: RunFigures) -> dict[str, Any]:
    return {"iteration_s": figures.iteration_s, "tokens_per_s": figures.tokens_per_s,
            "utilization_training": figures.utilization_training,
            "utilization_total": figures.utilization_total, "plan": figures.plan}


def _transfer_dict(got: TransferFigures) -> dict[str, Any]:
    out = {"link": got.link, "connections": got.connections, "one_connection_s": got.one_s,
           "many_connections_s": got.many_s}
    if got.many_paced_s is not None:
        out["many_connections_paced_s"] = got.many_paced_s
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
            not_run=not_run, detail=detail)
    return list(by_id.values())


def _value(detail: Mapping[str, BackendFigures], backend: Backend) -> float | None:
    figures = detail.get(backend)
    return None if figures is None else figures.get("value")
