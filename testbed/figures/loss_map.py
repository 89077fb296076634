"""Atlas against the DiLoCo family by time to loss, over the design space's WAN latency x
bandwidth (testbed.figures.space): at each cell every contender is simulated on the
conditions' topology and job, and the loss model turns its tokens/s into a predicted time
to the target (by default the loss every-step data parallelism reaches at the job's token
budget). The cell's winner is the fastest; its margin, the runner-up's time over its own.
Cells are simulated in parallel, one process per cell, each on its own."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

from testbed.common.progress import Counting, unseen
from testbed.common.units import plural
from testbed.errors import TestbedError, TestbedWarning, one_line
from testbed.experiments.planning import shared_cache
from testbed.experiments.run import simulated
from testbed.figures.space import Point, PointRecord, apply
from testbed.job.load import load_job
from testbed.run.spec import RunSpec
from testbed.topology.model import Topology

CONTENDERS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("atlas", ()),
    ("diloco", ()),
    ("streaming-diloco", ()),
)
"""Atlas, and the DiLoCo family at its policies' defaults (H = 500; H = 100 with the
paper's fragments of 3 layers, overlap 1, bf16 deltas), each run for whole cycles."""


class LossMapRow(PointRecord):
    """A row of the loss map's CSV: a point, and one policy's figures there."""

    policy: str
    target_loss: float | None
    tokens_per_s: float | None
    effective_tokens_per_s: float | None
    time_to_loss_s: float | None
    extrapolated: bool
    winner: bool
    why_none: str | None


@dataclass(frozen=True)
class Entrant:
    policy: str
    tokens_per_s: float | None
    time_s: float | None
    """Predicted time to the target; None: never, or the run failed (`why`)."""
    effective_tokens_per_s: float | None
    extrapolated: bool
    why: str | None = None


@dataclass(frozen=True)
class Cell:
    point: Point
    target: float | None
    entrants: tuple[Entrant, ...]

    @property
    def ranked(self) -> list[Entrant]:
        timed = [e for e in self.entrants if e.time_s is not None]
        return sorted(timed, key=lambda e: e.time_s or 0.0)

    @property
    def winner(self) -> Entrant | None:
        ranked = self.ranked
        return ranked[0] if ranked else None

    @property
    def margin(self) -> float | None:
        """The runner-up's time over the winner's (None without two timed entrants)."""
        ranked = self.ranked
        if len(ranked) < 2 or not ranked[0].time_s:
            return None
        return (ranked[1].time_s or 0.0) / ranked[0].time_s

    def as_rows(self) -> list[LossMapRow]:
        return [{**self.point.as_dict(), "policy": e.policy, "target_loss": self.target,
                 "tokens_per_s": e.tokens_per_s, "effective_tokens_per_s":
                 e.effective_tokens_per_s, "time_to_loss_s": e.time_s,
                 "extrapolated": e.extrapolated, "winner": self.winner is e,
                 "why_none": e.why} for e in self.entrants]


def cell_at(topology: Topology, point: Point, target: float | None,
            contenders: Sequence[tuple[str, tuple[tuple[str, str], ...]]] = CONTENDERS
            ) -> Cell:
    """Every contender simulated at one point of the grid, nothing written."""
    here = apply(point, topology)
    entrants = []
    with shared_cache(), warnings.catch_warnings():  # the point's cache: nothing carried over
        # whole cycles of DiLoCo's H steps run at every cell, as they should: said once, here
        warnings.simplefilter("ignore", TestbedWarning)
        for policy, options in contenders:
            try:
                job = load_job(here.job, here.source)
                record = simulated(RunSpec.build("simulate", here, job, policy=policy,
                                                 policy_options=dict(options),
                                                 target_loss=target))
                results = record.typed()
            except TestbedError as exc:
                entrants.append(Entrant(policy, None, None, None, False, one_line(str(exc))))
                continue
            ahead = results.loss_model["target"] if results.loss_model else None
            if ahead is None:
                entrants.append(Entrant(policy, results.tokens_per_s, None, None, False, None))
                continue
            entrants.append(Entrant(policy, results.tokens_per_s, ahead["time_s"],
                                    ahead["effective_tokens_per_s"], ahead["extrapolated"],
                                    ahead["reason"]))
            target = ahead["loss"]
    return Cell(point, target, tuple(entrants))


def loss_map(topology: Topology, latencies_ms: Sequence[float],
             bandwidths_gbit: Sequence[float], workers: int, count: Counting = unseen,
             target: float | None = None) -> list[Cell]:
    """Every cell of the grid, in its order: in this process with one worker, else in a
    pool of `workers` processes."""
    grid = [Point(lat, bw) for lat in latencies_ms for bw in bandwidths_gbit]
    processes = min(workers, len(grid))
    title = (f"time to loss: {plural(len(grid), 'cell')} on "
             f"{plural(processes, 'process', 'processes')}")
    with count(title, len(grid), "cell") as steps:
        if processes <= 1:
            out = []
            for point in grid:
                out.append(cell_at(topology, point, target))
                steps.finish(point.describe())
            return out
        with ProcessPoolExecutor(processes, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(cell_at, topology, point, target) for point in grid]
            cells = []
            for point, future in zip(grid, futures, strict=True):
                cells.append(future.result())
                steps.finish(point.describe())
            return cells


def winners(cells: Sequence[Cell]) -> dict[str, int]:
    """How many cells each contender wins."""
    out: dict[str, int] = {}
    for cell in cells:
        if cell.winner is not None:
            out[cell.winner.policy] = out.get(cell.winner.policy, 0) + 1
    return out


def summary(cells: Sequence[Cell]) -> str:
    """One line: who wins where, and by how much at most."""
    won = winners(cells)
    parts = [f"{policy} {plural(n, 'cell')}" for policy, n in
             sorted(won.items(), key=lambda kv: -kv[1])]
    margins = [m for c in cells if (m := c.margin) is not None]
    widest = f"; margins {min(margins):.2f}x-{max(margins):.2f}x" if margins else ""
    return f"fastest to the target loss: {', '.join(parts) or 'none'}{widest}"


def with_target(cells: Sequence[Cell]) -> float | None:
    """The target the cells were measured to."""
    return next((c.target for c in cells if c.target is not None), None)

