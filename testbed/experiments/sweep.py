"""What-if sweeps: a grid of knobs over one topology and job, as pure transformations.

A knob is `KEY=V1,V2,...` (`KEY=V1;V2;...` when the values hold commas themselves, as
events always do):
- any `--set` key: a job key (`microbatches`, `model.layers`) or a topology key
  (`wan.latency`, `wan.east-west.bandwidth`, `tcp.wmem`, `dc.gpus`, `dcs`: see
  testbed.topology.overrides);
- `option.[POLICY.]KEY`: a policy option as `-o [POLICY.]KEY=VALUE` gives it;
- `jitter`: the simulator's noise as `--jitter` takes it (`0` for none);
- `event`: one network event as `--event` takes it (`none` for none).
Every combination of the knobs' values is a point; each point runs every policy with
each bubble policy, `repeat` times (repeat k seeds the jitter with the job's seed + k, as
`compare` does).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict

from testbed.common.codec import raw
from testbed.common.sizes import MAX_SWEEP_RUNS
from testbed.common.units import plural
from testbed.errors import InputError, TestbedError
from testbed.experiments.comparison import ComparisonRun, check_repeat, comparison_runs
from testbed.experiments.inputs import Inputs
from testbed.job.load import JobDocument, apply_overrides, dump_job, parse_job
from testbed.job.model import Job
from testbed.plan.jitter import Jitter, parse_jitter
from testbed.plan.profile import Profile
from testbed.policy.loss_models import DEFAULT_LOSS_MODEL
from testbed.policy.registry import TRAINING_GROUP, discover
from testbed.report.run_results import Results
from testbed.run.spec import RunSpec
from testbed.topology.load import TopologyDocument, dump_topology
from testbed.topology.model import Topology
from testbed.topology.net_events import EventEntry, NetEvent, parse_event_flag
from testbed.topology.overrides import first_dcs, is_topology_key, override

__all__ = ["Knob", "Point", "SweepSettings", "first_dcs", "grid", "parse_vary", "points",
           "vary"]

OPTION = "option."
SPECIAL = ("jitter", "event")
FLAG = "--vary"


@dataclass(frozen=True)
class Knob:
    key: str
    values: tuple[str, ...]


class SweepDescription(TypedDict):
    """A sweep's settings as sweep.json keeps them (SweepSettings.describe)."""

    topology: TopologyDocument
    job: JobDocument
    events: list[EventEntry]
    policies: list[str]
    bubbles: list[str]
    knobs: list[list[str | list[str]]]
    """[key, [value, ...]] for each knob: a list, as read back from JSON, to compare."""
    options: list[str]
    repeat: int
    jitter: dict[str, float | None] | None
    profile: dict[str, dict[str, float]] | None
    target_loss: float | None
    loss_model: str


@dataclass(frozen=True)
class SweepSettings:
    """Everything that decides a sweep's rows."""

    inputs: Inputs
    policies: tuple[str, ...]
    knobs: tuple[Knob, ...]
    bubbles: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    """`-o [POLICY.]KEY=VALUE` for every point (a knob's option is given after them)."""
    repeat: int = 1
    jitter: Jitter | None = None
    profile: Profile | None = None
    target_loss: float | None = None
    """Sort each point's rows by the predicted time to this loss (its columns are there
    without it, to the default target: the synchronous loss at the token budget)."""
    loss_model: str = DEFAULT_LOSS_MODEL

    def describe(self) -> SweepDescription:
        """Plain data that tells two sweeps apart: what `--out` keeps, to go on with (the
        `settings` of sweep.json, a document of its own: the topology and job as their
        files have them)."""
        return {"topology": dump_topology(self.inputs.topology),
                "job": dump_job(self.inputs.job),
                "events": [e.as_raw() for e in self.inputs.events],
                "policies": list(self.policies), "bubbles": list(self.bubbles),
                "knobs": [[k.key, list(k.values)] for k in self.knobs],
                "options": list(self.options), "repeat": self.repeat,
                "jitter": self.jitter.as_dict() if self.jitter is not None else None,
                "profile": {str(k): v for k, v in sorted(self.profile.items())}
                if self.profile else None,
                "target_loss": self.target_loss, "loss_model": self.loss_model}


Cell = str | int | float | None
"""One cell of sweep.csv: a knob's value, a label, a figure or an error."""
Row = dict[str, Cell]
"""A row of sweep.csv (and of points.jsonl): the knobs' values under the keys the user
varied (so a mapping, not a closed type), what ran (policy, bubble, repeat), what it
measured (`row_metrics`: METRICS, BUBBLE_METRICS), its speedup and error."""


def number(cell: Cell) -> float | None:
    """A row's figure, or None where it has none."""
    return float(cell) if isinstance(cell, int | float) and not isinstance(cell, bool) \
        else None


@dataclass(frozen=True)
class PointRun:
    labels: Row
    """The row's policy, bubble policy and repeat."""
    spec: RunSpec


@dataclass(frozen=True)
class Point:
    index: int
    values: tuple[tuple[str, str], ...]
    """(knob, value) for each knob."""
    runs: tuple[PointRun, ...]


def parse_vary(text: str) -> Knob:
    """`wan.latency=10ms,20ms` -> Knob("wan.latency", ("10ms", "20ms"))."""
    key, sep, values = text.partition("=")
    separator = ";" if ";" in values or key.strip() == "event" else ","
    items = tuple(v.strip() for v in values.split(separator) if v.strip())
    if not sep or not key.strip() or not items:
        raise InputError(f"expected KEY=V1,V2,... (or KEY=V1;V2;... when values hold "
                         f"commas), got {text!r}", FLAG)
    return Knob(key.strip(), items)


def grid(knobs: Sequence[Knob]) -> list[tuple[tuple[str, str], ...]]:
    """Every combination of the knobs' values, the last knob turning fastest."""
    return [tuple(zip([k.key for k in knobs], combo, strict=True))
            for combo in itertools.product(*(k.values for k in knobs))]


def vary(topology: Topology, job: Job, key: str, value: str, flag: str = FLAG
         ) -> tuple[Topology, Job]:
    """The topology and job with `key` set to `value`, as `--set` would (a topology key
    or any job key)."""
    if is_topology_key(key):
        return override(topology, key, value, flag), job
    data = raw(dump_job(job))
    apply_overrides(data, [f"{key.removeprefix('job.')}={value}"])
    try:
        return topology, parse_job(data, flag, "")
    except InputError as exc:
        hint = (f" (a policy option is swept as {OPTION}{key})"
                if key.split(".")[0] in discover(TRAINING_GROUP) else "")
        raise InputError(exc.problem + hint, flag, exc.key) from None


def points(settings: SweepSettings) -> list[Point]:
    """Every point's runs, each checked as a run would check it: a bad knob, value or
    option is an InputError naming it before anything runs."""
    keys = [k.key for k in settings.knobs]
    twice = {k for k in keys if keys.count(k) > 1}
    if twice:
        raise InputError(f"{sorted(twice)[0]} is varied twice; give its values once", FLAG)
    check_repeat(settings.repeat)
    combos = len(settings.policies) * max(1, len(settings.bubbles)) * settings.repeat
    count = math.prod(len(k.values) for k in settings.knobs)
    if count * combos > MAX_SWEEP_RUNS:
        raise InputError(f"{plural(count, 'point')} x {plural(combos, 'run')} each make "
                         f"{count * combos:,} runs, more than a sweep takes "
                         f"({MAX_SWEEP_RUNS:,}, testbed's limit)", FLAG)
    return [Point(index, values, tuple(_runs(settings, values)))
            for index, values in enumerate(grid(settings.knobs))]


def _runs(settings: SweepSettings, values: tuple[tuple[str, str], ...]) -> list[PointRun]:
    """The point's runs, as `compare` makes them (testbed.experiments.comparison)."""
    topology, job = settings.inputs.topology, settings.inputs.job
    jitter = settings.jitter
    swept: list[tuple[str, str]] = []
    event_texts: list[str] = []
    for key, value in values:
        if key.startswith(OPTION):
            swept.append((key, f"{key.removeprefix(OPTION)}={value}"))
        elif key == "jitter":
            jitter = _jitter(value)
        elif key == "event":
            event_texts += [] if value == "none" else [value]
        else:
            topology, job = vary(topology, job, key, value)
    events = settings.inputs.events + tuple(_event(t, topology) for t in event_texts)
    if settings.bubbles and job.inference is None:
        raise InputError("a bubble policy needs an inference workload (job.inference)", "-b")
    base = RunSpec.build("simulate", topology, job, policy=settings.policies[0],
                         profile=settings.profile, events=events, jitter=jitter,
                         target_loss=settings.target_loss, loss_model=settings.loss_model)

    def made(options: Sequence[str]) -> list[ComparisonRun]:
        return comparison_runs(base, settings.policies, settings.bubbles, options,
                               settings.repeat)

    try:
        runs = made([*settings.options, *(pair for _, pair in swept)])
    except TestbedError as exc:
        made(settings.options)  # an -o of every point's: its own error
        for key, pair in swept:  # else the knob whose option it is
            try:
                made([*settings.options, pair])
            except TestbedError as mine:
                problem = mine.problem if isinstance(mine, InputError) else str(mine)
                raise InputError(problem, FLAG, key) from None
        raise exc
    out = []
    for run in runs:
        labels: Row = {"policy": run.label}  # a labelled variant's label
        if settings.bubbles:
            labels["bubble"] = run.spec.common.bubble_policy
        if settings.repeat > 1:
            labels["repeat"] = run.repeat + 1
        out.append(PointRun(labels, run.spec))
    return out


def _jitter(value: str) -> Jitter:
    try:
        return parse_jitter("0" if value == "none" else value)
    except ValueError as exc:
        raise InputError(str(exc), FLAG, "jitter") from None


def _event(text: str, topology: Topology) -> NetEvent:
    try:
        return parse_event_flag(text, topology)
    except InputError as exc:
        where = f"{exc.key}: " if exc.key else ""
        raise InputError(f"{where}{exc.problem}", FLAG, "event") from None


def columns(settings: SweepSettings) -> list[str]:
    """sweep.csv's columns: the knobs, what ran, and what it measured."""
    out = [k.key for k in settings.knobs] + ["policy"]
    out += ["bubble"] if settings.bubbles else []
    out += ["repeat"] if settings.repeat > 1 else []
    out += METRICS
    out += ["speedup"] if len(settings.policies) > 1 else []
    out += BUBBLE_METRICS if settings.bubbles else []
    return [*out, "error"]


METRICS = ("iteration_s", "tokens_per_s", "effective_tokens_per_s", "target_loss",
           "time_to_loss_s", "gpu_utilization", "wan_utilization", "dp", "pp")
"""sweep.csv's measures of every run (row_metrics says where each comes from)."""
BUBBLE_METRICS = ("gpu_utilization_total", "requests", "served", "rejected", "ttft_p50_s",
                  "ttft_p99_s")
"""Its measures of the runs that fill bubbles."""


def row_metrics(results: Results) -> Row:
    """A run's measures as sweep.csv has them, from its results; the iteration is the
    typical one, as compare's table has it (a DiLoCo cycle's mean, not its median step
    without the sync)."""
    target = results.loss_model["target"] if results.loss_model else None
    inference = results.inference
    return {
        "iteration_s": results.typical_s,
        "tokens_per_s": results.tokens_per_s,
        "effective_tokens_per_s": target["effective_tokens_per_s"] if target else None,
        "target_loss": target["loss"] if target else None,
        "time_to_loss_s": target["time_s"] if target else None,
        "gpu_utilization": results.gpu_utilization.training,
        "wan_utilization": results.wan.utilization,
        "dp": results.plan.get("dp"), "pp": results.plan.get("pp"),
        "gpu_utilization_total": results.gpu_utilization.total,
        "requests": inference.requests, "served": inference.served,
        "rejected": inference.rejected, "ttft_p50_s": inference.ttft_s.p50,
        "ttft_p99_s": inference.ttft_s.p99,
    }


def with_speedups(rows: list[Row], policies: Sequence[str], knobs: Sequence[str]
                  ) -> list[Row]:
    """Each row's tokens/s over the first policy's at the same point, bubble policy and
    repeat (how runs are compared: testbed.metrics.summary.speedup)."""
    from testbed.metrics.summary import speedup

    def where(row: Row) -> tuple[Cell, ...]:
        return (*(row.get(k) for k in knobs), row.get("bubble"), row.get("repeat"))

    base = {where(r): number(r.get("tokens_per_s")) for r in rows
            if r["policy"] == policies[0]}
    return [{**row, "speedup": speedup(number(row.get("tokens_per_s")),
                                       base.get(where(row)))}
            for row in rows]


def by_time_to_loss(rows: list[Row], knobs: Sequence[str]) -> list[Row]:
    """Each point's rows sorted by their predicted time to the target loss (those without
    one last, in their order); the points stay in grid order."""
    out: list[Row] = []
    for _, group in itertools.groupby(rows, key=lambda r: tuple(r.get(k) for k in knobs)):
        out += sorted(group, key=lambda r: (number(r.get("time_to_loss_s")) is None,
                                            number(r.get("time_to_loss_s")) or 0.0))
    return out
