"""Runs what the claims ask for, by either backend: training runs through testbed.experiments.run
(the same run directories `simulate`, `up` and `compare` write) and the one-transfer
measurement, in the simulator's flow model or over the emulated WAN (time-dilated where
the link exceeds what this machine forwards)."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from pathlib import Path

from testbed.common.fsutil import own_directory
from testbed.errors import TestbedError
from testbed.experiments.inputs import Inputs
from testbed.experiments.run import run, simulated
from testbed.experiments.sweep import first_dcs
from testbed.figures.claims import Backend, Requests, RunAsk, RunFigures, TransferFigures
from testbed.job.load import load_job
from testbed.plan.pacing import paced
from testbed.report.run_results import Inference, Results
from testbed.run.spec import RunSpec
from testbed.sim.one_transfer import one_transfer_s
from testbed.topology.model import Topology

Say = Callable[[str], None]
EMULATED_ITERATIONS = 3
EMULATED_MESSAGES = 5
"""Messages per emulated transfer measurement: the first opens the windows, the median of
the rest is the warm figure."""


def figures_of(results: Results) -> RunFigures:
    """What the claims read from a results.json."""
    plan = results.plan
    dcs = sorted({gpu.rpartition("-")[0] for gpus in (plan.get("placement") or {}).values()
                  for gpu in gpus})
    # a GPU holding several stages (interleaved, ZB-V) is one GPU
    gpus = len({gpu for g in (plan.get("placement") or {}).values() for gpu in g})
    return RunFigures(
        iteration_s=results.iteration_time_s.median, tokens_per_s=results.tokens_per_s,
        utilization_training=results.gpu_utilization.training,
        utilization_total=results.gpu_utilization.total,
        plan=f"dp {plan.get('dp')} x pp {plan.get('pp')} on {'+'.join(dcs)}" if plan else "",
        gpus=gpus or None, wan_utilization=results.wan.utilization,
        requests=requests_of(results.inference))


def requests_of(inference: Inference) -> Requests | None:
    """The inference block's counts, or None for a run that had no requests."""
    if not inference.requests:
        return None
    overruns = inference.overruns
    return Requests(inference.requests, inference.served, inference.expired,
                    inference.rejected, inference.ttft_s.p50, inference.ttft_s.p99,
                    overruns.get("prefills") if overruns else None,
                    overruns.get("overran") if overruns else None)


def wan_connections(connections: dict[str, int]) -> set[tuple[str, str, int]]:
    """(DC, DC, connections) of each GPU pair that talks across the WAN."""
    out: set[tuple[str, str, int]] = set()
    for pair, n in connections.items():
        a, _, b = pair.partition(":")
        dc_a, dc_b = sorted((a.rpartition("-")[0], b.rpartition("-")[0]))
        if dc_a != dc_b:
            out.add((dc_a, dc_b, n))
    return out


class Runner:
    """Runs each distinct ask once per backend and conditions (claims share runs)."""

    def __init__(self, inputs: Inputs, backend: Backend, directory: Path | None, say: Say,
                 wall_budget_s: float | None = None, detail: Say = lambda _m: None) -> None:
        self.inputs, self.backend, self.directory, self.say = inputs, backend, directory, say
        """`directory` None: simulated runs kept in memory, written nowhere (a search
        over many points keeps only their figures). `say`: a line as each run starts;
        `detail`: the written runs' own lines (the emulator's, the plan search's)."""
        self.detail = detail
        self.wall_budget_s = wall_budget_s
        """Emulator: runs predicted to take longer are skipped, with the reason."""
        self.done: dict[RunAsk, RunFigures | str] = {}

    def figures(self, ask: RunAsk) -> RunFigures | str:
        """The run's figures, or why it has none."""
        key = dataclasses.replace(ask, key="")
        if key not in self.done:
            self.done[key] = self._run(ask)
        return self.done[key]

    def _run(self, ask: RunAsk) -> RunFigures | str:
        topology = self.inputs.topology
        if ask.dcs is not None:
            topology = first_dcs(topology, ask.dcs)
        name = "-".join(part for part in (ask.policy, ask.bubbles, *(
            f"{k}={v}" for k, v in ask.options), *ask.sets,
            f"dcs={ask.dcs}" if ask.dcs else "") if part).replace("/", "per")
        self.say(f"{self.backend}: {ask.label()}{f' on {ask.dcs} DCs' if ask.dcs else ''}")
        sets = list(ask.sets)
        if self.backend == "emulate":  # a warm-up and two measured iterations
            sets.append(f"iterations={min(self.inputs.job.iterations, EMULATED_ITERATIONS)}")
        try:
            job = load_job(dict(self.inputs.topology.job or {}), topology.source, None, sets)
            spec = RunSpec.build(
                self.backend, topology, job, policy=ask.policy,
                policy_options=dict(ask.options), bubble_policy=ask.bubbles,
                bubble_options={} if ask.bubbles else None,
                dilation="auto" if self.backend == "emulate" else 1,
                wall_budget_s=self.wall_budget_s)
            if self.directory is None:
                return figures_of(simulated(spec).typed())
            outcome = run(spec, own_directory(self.directory, "runs", name), self.detail)
        except TestbedError as exc:
            return str(exc)
        if outcome.error is not None:
            return str(outcome.error)
        return figures_of(outcome.typed)


def transfer(topology: Topology, link: tuple[str, str], nbytes: int, connections: int,
             backend: Backend, say: Say) -> TransferFigures:
    """One activation over a WAN link, 1 connection against `connections`, windows open."""
    a, b = link
    say(f"{backend}: {nbytes / 1e6:.0f} MB over {a}-{b}, 1 and {connections} connections")
    if backend == "simulate":
        one = one_transfer_s(topology, a, b, nbytes, 1, warm=True)
        many = one_transfer_s(topology, a, b, nbytes, connections, warm=True)
        return TransferFigures(one, many, connections, f"{a}-{b}")
    one = _emulated_transfer(topology, a, b, nbytes, 1)
    many = _emulated_transfer(topology, a, b, nbytes, connections)
    paced_too = None
    if not paced(topology, a, b, nbytes):
        paced_too = _emulated_transfer(topology, a, b, nbytes, connections, force_pacing=True)
    return TransferFigures(one, many, connections, f"{a}-{b}", paced_too)


def _emulated_transfer(topology: Topology, a: str, b: str, nbytes: int,
                       connections: int, force_pacing: bool = False) -> float:
    """Over the emulated pair of DCs, dilated and paced as a run would be (or paced
    regardless); in represented seconds."""
    from testbed.emulator.net.network import bring_up, tear_down
    from testbed.emulator.runtime.coordinator.capacity import machine_capacity_bps
    from testbed.emulator.runtime.coordinator.probe import timed_messages
    from testbed.run.dilation import choose_dilation, dilate_topology

    pair = first_dcs(_only(topology, a, b), 2)
    rate = pair.bottleneck_bps(a, b)
    k = choose_dilation(rate, machine_capacity_bps())
    dilated = dilate_topology(pair, k)
    pace = rate / k if force_pacing or paced(pair, a, b, nbytes) else 0.0
    network = bring_up(dilated)
    try:
        seconds = timed_messages(network, f"{a}-0", f"{b}-0", connections,
                                 EMULATED_MESSAGES, nbytes, pace)
    finally:
        tear_down(network)
    return statistics.median(seconds[1:]) / k


def _only(topology: Topology, a: str, b: str) -> Topology:
    """The two DCs of a link, in that order, one GPU each, and the link between them."""
    keep = [dataclasses.replace(topology.dc(name), gpus=1) for name in (a, b)]
    links = tuple(link for link in topology.links if set(link.pair) == {a, b})
    return dataclasses.replace(topology, datacenters=tuple(keep), links=links, job=None,
                               events=None)


