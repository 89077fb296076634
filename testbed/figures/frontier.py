"""Where an "up to" figure holds: each claim searched, in the simulator, over the sourced
design space of testbed.figures.space, for the largest figure it reaches (for the
slowdown, a cost, the largest it comes to: whether "no impact" holds everywhere), with
the conditions it reaches it at.

The search: every WAN latency x bandwidth of the space's grid at the conditions' own
TCP buffers, model and DC count (the heat map); then, from each claim's best cell, each
other knob in turn (TCP buffers, model, DCs; the request rate for BubbleTea's claims);
then those knobs' best values together. A coordinate search, not every combination: it
finds where each knob pushes a figure at a cost a user can wait for. Points are
simulated in parallel by `evaluate`, one process per point, each point on its own."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal, TypedDict

from testbed.common.progress import Counting, unseen
from testbed.common.units import plural
from testbed.errors import TestbedError
from testbed.experiments.inputs import Inputs
from testbed.experiments.planning import shared_cache
from testbed.figures.claim_runs import BackendFigures, measure_claim
from testbed.figures.claims import Conditions, claims
from testbed.figures.measure import Runner
from testbed.figures.space import MODELS, Point, PointRecord, apply
from testbed.figures.why import why
from testbed.job.load import load_job
from testbed.topology import dump_topology, load_topology
from testbed.topology.model import Topology

Knob = Literal["buffers", "model", "dcs", "rate"]
SearchName = Literal["coarse", "full", "off"]


@dataclass(frozen=True)
class Space:
    latencies_ms: tuple[float, ...]
    bandwidths_gbit: tuple[float, ...]
    buffers: tuple[float, ...]
    """Fractions of the bandwidth-delay product the TCP buffers are raised to."""
    models: tuple[str, ...]
    dcs: tuple[int, ...]
    rates: tuple[int, ...]

    def values(self, knob: Knob) -> tuple[Any, ...]:
        return {"buffers": self.buffers, "model": self.models, "dcs": self.dcs,
                "rate": self.rates}[knob]


SPACES: dict[str, Space] = {
    "coarse": Space((5, 25, 150), (0.1, 1, 10, 100), (1.0,), ("llama2-7b", "llama2-70b"),
                    (5,), (1600,)),
    "full": Space((5, 10, 20, 35, 50, 75, 100, 150), (0.1, 0.3, 1, 3, 10, 30, 100),
                  (0.25, 1.0), tuple(MODELS), (2, 3, 4, 5), (100, 200, 800, 1600)),
}
"""coarse: `testbed figures`'s default; full: `--frontier full`. Their sources and times
are in testbed.figures.space and the README."""

KNOBS: Mapping[str, tuple[Knob, ...]] = {
    "multi_tcp": ("buffers", "model"),
    "bubbletea_utilization": ("rate", "model", "dcs"),
    "bubbletea_slowdown": ("rate", "model", "dcs"),
}
"""What else each claim is searched over; the rest: buffers, model and DCs."""
OTHER_KNOBS: tuple[Knob, ...] = ("buffers", "model", "dcs")


class UpTo(TypedDict):
    """claims.json's `up_to`: the largest figure the search found, and where."""

    value: float | None
    conditions: str
    """The point as a reader takes it in (what differs from the claim's conditions)."""
    point: PointRecord
    reached: bool | None
    """Whether the paper's figure (the target) is reached there; None without one."""
    why: str | None
    """What bounds the figure at that point (testbed.figures.why)."""
    points: int
    search: str


@dataclass(frozen=True)
class PointResult:
    point: Point
    figures: dict[str, BackendFigures]
    """Each claim measured at the point, by its id."""


@dataclass
class Frontier:
    """One claim's search: every point measured, in the order they were."""

    claim: str
    results: dict[Point, BackendFigures]

    def best(self) -> tuple[Point, float] | None:
        """The point of the largest value (the first such, in search order)."""
        found = [(p, v) for p, f in self.results.items() if (v := f.get("value")) is not None]
        return max(found, key=lambda pv: pv[1]) if found else None

    def up_to(self, target: float | None, at_most: bool, search: str) -> UpTo:
        best = self.best()
        if best is None:
            return UpTo(value=None, conditions="no point measured", point={}, reached=None,
                        why=None, points=len(self.results), search=search)
        point, value = best
        reached = None if target is None else (value <= target if at_most else value >= target)
        return UpTo(value=value, conditions=point.describe(), point=point.as_dict(),
                    reached=reached, why=why(self.claim, self.results[point].get("runs", {}),
                                             target),
                    points=len(self.results), search=search)


def search(topology: Topology, conditions: Conditions, wanted: Sequence[str], space: Space,
           workers: int, count: Counting = unseen) -> dict[str, Frontier]:
    """Each wanted claim's frontier over `space`, from the conditions' topology and job;
    each phase's points counted by `count`."""
    frontiers = {claim: Frontier(claim, {}) for claim in wanted}
    grid = [Point(lat, bw) for lat in space.latencies_ms for bw in space.bandwidths_gbit]
    _merge(frontiers, evaluate(topology, conditions,
                               [(p, tuple(wanted)) for p in grid], workers, count, "grid"))
    asks: dict[Point, list[str]] = {}
    for claim, frontier in frontiers.items():
        best = frontier.best()
        start = best[0] if best else grid[0]
        for knob in KNOBS.get(claim, OTHER_KNOBS):
            for value in space.values(knob):
                if knob == "dcs" and value == len(topology.datacenters):
                    continue  # the conditions' own: the grid has it
                point = dataclasses.replace(start, **{knob: value})
                if point not in frontier.results:
                    asks.setdefault(point, []).append(claim)
    _merge(frontiers, evaluate(topology, conditions, _tasks(asks), workers, count,
                               "one knob at a time"))
    asks = {}
    for claim, frontier in frontiers.items():
        combined = _combined(frontier, KNOBS.get(claim, OTHER_KNOBS))
        if combined is not None and combined not in frontier.results:
            asks.setdefault(combined, []).append(claim)
    _merge(frontiers, evaluate(topology, conditions, _tasks(asks), workers, count,
                               "the best knobs together"))
    return frontiers


def _tasks(asks: Mapping[Point, list[str]]) -> list[tuple[Point, tuple[str, ...]]]:
    return [(point, tuple(claims)) for point, claims in asks.items()]


def _combined(frontier: Frontier, knobs: Iterable[Knob]) -> Point | None:
    """The best grid cell with every knob at the value that beat it alone, when two or
    more did."""
    grid = {p: f for p, f in frontier.results.items() if p == Point(p.latency_ms,
                                                                    p.bandwidth_gbit)}
    cell = Frontier(frontier.claim, grid).best()
    if cell is None:
        return None
    start, floor = cell
    better: dict[str, Any] = {}  # keyword arguments for replace: each knob's own type
    for knob in knobs:
        tried = [(getattr(p, knob), v) for p, f in frontier.results.items()
                 if (v := f.get("value")) is not None and v > floor
                 and p == dataclasses.replace(start, **{knob: getattr(p, knob)})]
        if tried:
            better[knob] = max(tried, key=lambda kv: kv[1])[0]
    return dataclasses.replace(start, **better) if len(better) >= 2 else None


def _merge(frontiers: dict[str, Frontier], results: Iterable[PointResult]) -> None:
    for result in results:
        for claim, figures in result.figures.items():
            frontiers[claim].results[result.point] = figures


def evaluate(topology: Topology, conditions: Conditions,
             tasks: Sequence[tuple[Point, tuple[str, ...]]], workers: int, count: Counting,
             phase: str) -> list[PointResult]:
    """Each (point, claims) measured, in order: in this process with one worker, else in
    a pool of `workers` processes; each point a step of `count` as it ends. The one place
    points are run, so that a distributed engine can take over; a point's result depends
    on nothing but the point."""
    if not tasks:
        return []
    processes = min(workers, len(tasks))
    title = (f"frontier, {phase}: {plural(len(tasks), 'point')} on "
             f"{plural(processes, 'process', 'processes')}")
    with count(title, len(tasks), "point") as steps:
        if processes <= 1:
            out = []
            for point, wanted in tasks:
                out.append(measure_point(topology, conditions, point, wanted))
                steps.finish(point.describe())
            return out
        with ProcessPoolExecutor(processes, mp_context=get_context("spawn")) as pool:
            futures = {pool.submit(measure_point, topology, conditions, point, wanted): point
                       for point, wanted in tasks}
            for future in as_completed(futures):
                steps.finish(futures[future].describe())
            return [future.result() for future in futures]


def measure_point(topology: Topology, conditions: Conditions, point: Point,
                  wanted: tuple[str, ...]) -> PointResult:
    """The wanted claims at one point, simulated, nothing written."""
    here = apply(point, topology)
    if point.rate:
        conditions = dataclasses.replace(conditions, requests_per_s=point.rate)
    try:
        job = load_job(here.job, here.source)
    except TestbedError as exc:
        return PointResult(point, {c: {"value": None, "why_none": str(exc)} for c in wanted})
    runner = Runner(Inputs(here, job), "simulate", None, lambda _m: None)
    out: dict[str, BackendFigures] = {}
    with shared_cache():  # the point's own: nothing carries over from another point
        for spec in claims(here, job, conditions):
            if spec.id in wanted:
                out[spec.id] = measure_claim(runner, spec)
    return PointResult(point, out)


@dataclass
class ClaimSearch:
    """One claim's frontier, from conditions that share a shape (the same DCs, GPUs, TCP
    and job; their WAN links are the space's): wan-3dc and paper-3dc share one."""

    claim: str
    conditions: list[str]
    """The conditions files it stands for."""
    frontier: Frontier
    target: float | None
    at_most: bool


def search_all(conditions: Sequence[Conditions], wanted: set[str] | None, space: Space,
               workers: int, count: Counting = unseen) -> list[ClaimSearch]:
    """Every wanted claim searched once per shape of conditions."""
    shapes: dict[str, list[tuple[Conditions, Topology]]] = {}
    for cond in conditions:
        topology = load_topology(Path(cond.topology))
        shapes.setdefault(shape(topology), []).append((cond, topology))
    out: list[ClaimSearch] = []
    for members in shapes.values():
        cond, topology = members[0]
        specs = [s for s in claims(topology, load_job(topology.job, topology.source), cond)
                 if wanted is None or s.id in wanted]
        found = search(topology, cond, [s.id for s in specs], space, workers, count)
        out += [ClaimSearch(s.id, [c.topology for c, _ in members], found[s.id], s.target,
                            s.at_most) for s in specs]
    return out


def shape(topology: Topology) -> str:
    """What a search depends on besides the WAN's latencies and bandwidths."""
    links = tuple(dataclasses.replace(link, latency_s=0.0, bandwidth_bps=0.0)
                  for link in topology.links)
    plain = dataclasses.replace(topology, name="", links=links, source=None)
    return json.dumps(dump_topology(plain), sort_keys=True, default=str)


def default_workers() -> int:
    return len(os.sched_getaffinity(0))
