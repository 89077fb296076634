"""A claim's figure by one backend at one set of conditions: from the runs it asks for,
or, for multiple connections, from one transfer over the link Atlas's plan opens most
connections on. Both `figures` at the stated conditions and the search for where an
"up to" figure holds (testbed.figures.frontier) measure claims through here."""

from __future__ import annotations

import dataclasses
from typing import TypedDict, cast

from testbed.errors import TestbedError
from testbed.experiments.planning import plan_with_simulator
from testbed.figures.claims import MULTI_TCP, ClaimSpec, RunFigures, multi_tcp_link
from testbed.figures.measure import Runner, transfer, wan_connections
from testbed.policy import training_policy


class RequestsRow(TypedDict):
    """A run's Requests (testbed.figures.claims) as claims.json has them."""

    arrived: int
    served: int
    expired: int | None
    rejected: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    prefills: int | None
    overran: int | None


class ClaimRun(TypedDict, total=False):
    """One run behind a claim as claims.json has it: a run's RunFigures under its label,
    its error, or the transfer multiple connections are measured by."""

    run: str
    error: str
    iteration_s: float | None
    tokens_per_s: float | None
    utilization_training: float | None
    utilization_total: float | None
    plan: str
    gpus: int | None
    wan_utilization: float | None
    requests: RequestsRow | None
    link: str
    connections: int
    one_connection_s: float
    many_connections_s: float
    many_connections_paced_s: float
    bytes: int
    one_way_s: float
    bandwidth_bps: float
    window_bytes: int


class BackendFigures(TypedDict, total=False):
    value: float | None
    runs: dict[str, ClaimRun]
    """Each run's figures (or its error) by its key in the claim."""
    why_none: str


def measure_claim(runner: Runner, spec: ClaimSpec) -> BackendFigures:
    """The claim's value and what it was computed from."""
    if spec.id == MULTI_TCP:
        return _multi_tcp(runner)
    measured: dict[str, RunFigures] = {}
    runs: dict[str, ClaimRun] = {}
    for ask in spec.runs:
        got = runner.figures(ask)
        if isinstance(got, str):
            runs[ask.key] = {"run": ask.label(), "error": got}
            return {"value": None, "runs": runs, "why_none": f"{ask.label()} failed: {got}"}
        measured[ask.key] = got
        # RunFigures' fields, in their order, are ClaimRun's keys
        runs[ask.key] = cast(ClaimRun, {"run": ask.label(), **dataclasses.asdict(got)})
    value = spec.value(measured)
    figures: BackendFigures = {"value": value, "runs": runs}
    if value is None:
        figures["why_none"] = "a run measured no iteration"
    return figures


def _multi_tcp(runner: Runner) -> BackendFigures:
    """Over the link Atlas's plan opens most connections on: its plan, not a run of it."""
    topology, job = runner.inputs.topology, runner.inputs.job
    try:
        plan = plan_with_simulator(training_policy("atlas"), topology, job)
    except TestbedError as exc:
        return {"value": None, "runs": {}, "why_none": f"atlas cannot plan: {exc}"}
    chosen = multi_tcp_link(topology, wan_connections(plan.summary()["connections"]))
    if chosen is None:
        return {"value": None, "runs": {}, "why_none": "Atlas's plan crosses no WAN link"}
    (a, b), connections = chosen
    got = transfer(topology, (a, b), job.activation_bytes, connections, runner.backend,
                   runner.say)
    out: ClaimRun = {
        "link": got.link, "connections": got.connections, "one_connection_s": got.one_s,
        "many_connections_s": got.many_s, "bytes": job.activation_bytes,
        "one_way_s": topology.one_way_latency(a, b),
        "bandwidth_bps": topology.bottleneck_bps(a, b),
        "window_bytes": min(topology.tcp_for(a).wmem[2], topology.tcp_for(b).rmem[2])}
    if got.many_paced_s is not None:
        out["many_connections_paced_s"] = got.many_paced_s
    return {"value": got.one_s / got.many_s, "runs": {"transfer": out}}
