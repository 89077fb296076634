"""A claim's figure by one backend at one set of conditions: from the runs it asks for,
or, for multiple connections, from one transfer over the link Atlas's plan opens most
connections on. Both `figures` at the stated conditions and the search for where an
"up to" figure holds (testbed.figures.frontier) measure claims through here."""

from __future__ import annotations

import dataclasses
from typing import TypedDict

from testbed.common.codec import JsonObject
from testbed.errors import TestbedError
from testbed.experiments.planning import plan_with_simulator
from testbed.figures.claims import MULTI_TCP, ClaimSpec, RunFigures, multi_tcp_link
from testbed.figures.measure import Runner, transfer, wan_connections
from testbed.policy import training_policy


class BackendFigures(TypedDict, total=False):
    value: float | None
    runs: dict[str, JsonObject]
    """Each run's figures (or its error) by its key in the claim."""
    why_none: str


def measure_claim(runner: Runner, spec: ClaimSpec) -> BackendFigures:
    """The claim's value and what it was computed from."""
    if spec.id == MULTI_TCP:
        return _multi_tcp(runner)
    measured: dict[str, RunFigures] = {}
    runs: dict[str, JsonObject] = {}
    for ask in spec.runs:
        got = runner.figures(ask)
        if isinstance(got, str):
            runs[ask.key] = {"run": ask.label(), "error": got}
            return {"value": None, "runs": runs, "why_none": f"{ask.label()} failed: {got}"}
        measured[ask.key] = got
        runs[ask.key] = {"run": ask.label(), **dataclasses.asdict(got)}
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
    out: JsonObject = {
        "link": got.link, "connections": got.connections, "one_connection_s": got.one_s,
        "many_connections_s": got.many_s, "bytes": job.activation_bytes,
        "one_way_s": topology.one_way_latency(a, b),
        "bandwidth_bps": topology.bottleneck_bps(a, b),
        "window_bytes": min(topology.tcp_for(a).wmem[2], topology.tcp_for(b).rmem[2])}
    if got.many_paced_s is not None:
        out["many_connections_paced_s"] = got.many_paced_s
    return {"value": got.one_s / got.many_s, "runs": {"transfer": out}}
