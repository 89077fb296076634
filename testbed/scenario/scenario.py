"""A scenario file (`--scenario FILE`): what happens during a run, read by both backends.

```yaml
events: [...]             # network events, as a topology's `events`
traces:                   # link bandwidth (latency, loss) over time: testbed.scenario.link_traces
  - {link: [east, west], csv: bw.csv}
stragglers:               # slower compute for a while: testbed.scenario.slowdowns
  - {at: 0s, gpu: west-0, slower: 1.5, for: 5s}
failures:                 # a worker lost at a time, optionally back later
  - {at: 2s, worker: east-1, back: 10s}
recovery: {detect: 1s, restart: 10s}
```

Times count from the start of training; paths are relative to the scenario file.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from testbed.common.fields import Fields, bounded, number
from testbed.common.sizes import MAX_RUN_S
from testbed.common.units import format_duration, parse_duration
from testbed.common.yamlio import read_yaml
from testbed.errors import InputError
from testbed.scenario.link_traces import LinkTrace, TraceRecord, parse_trace
from testbed.scenario.slowdowns import Straggler, StragglerEntry, first_over
from testbed.topology.model import Topology
from testbed.topology.net_events import NetEvent, parse_events

SECTIONS = ("events", "traces", "stragglers", "failures", "recovery")
MAX_SLOWER = 1000.0
"""How many times slower a GPU may compute, one straggler or several overlapping (they
multiply) together: a second of compute becomes 17 minutes. Past it a few stacked
entries reach times the simulator's clock cannot hold (eight of 1000 made 1e24 s)."""
DEFAULT_DETECT_S = 1.0
DEFAULT_RESTART_S = 10.0
MAX_RECOVERY_S = 86_400.0
"""The longest noticing a failure, or starting the job again, may take: a day (a restart
that reloads a large model's checkpoint takes minutes to hours; 1e300 s was taken, and
printed a summary of 301 digits)."""


class FailureEntry(TypedDict):
    """A `failures` entry as a scenario file has it; results.json's add `applied`."""

    at: str
    worker: str
    back: NotRequired[str]
    applied: NotRequired[bool]


class RecoveryEntry(TypedDict):
    detect: str
    restart: str


class ScenarioRecord(TypedDict):
    """What results.json records of a scenario (testbed.scenario.reach marks each entry
    with whether training reached it)."""

    file: str | None
    traces: list[TraceRecord]
    stragglers: list[StragglerEntry]
    failures: list[FailureEntry]
    recovery: RecoveryEntry


@dataclass(frozen=True)
class WorkerLoss:
    """A `failures` entry: the worker on GPU `worker` is lost at `at_s` and, when `back_s`
    is given, its GPU is usable again from then on."""

    at_s: float
    worker: str
    back_s: float | None = None

    def shifted(self, by: float) -> WorkerLoss:
        return WorkerLoss(self.at_s - by, self.worker,
                          None if self.back_s is None else self.back_s - by)

    def dilated(self, k: float) -> WorkerLoss:
        return WorkerLoss(self.at_s * k, self.worker,
                          None if self.back_s is None else self.back_s * k)

    def as_raw(self) -> FailureEntry:
        raw: FailureEntry = {"at": f"{self.at_s:g}s", "worker": self.worker}
        if self.back_s is not None:
            raw["back"] = f"{self.back_s:g}s"
        return raw

    def describe(self) -> str:
        back = f", back at {self.back_s:g} s" if self.back_s is not None else ""
        return f"worker {self.worker} lost at {self.at_s:g} s{back}"


@dataclass(frozen=True)
class Recovery:
    """What a failure costs beyond the work lost since the last checkpoint: the time to
    notice it (the emulator's is what its coordinator took, at least this) and to start
    the job again (rescheduling, starting processes, loading the checkpoint)."""

    detect_s: float = DEFAULT_DETECT_S
    restart_s: float = DEFAULT_RESTART_S

    def as_raw(self) -> RecoveryEntry:
        return {"detect": f"{self.detect_s:g}s", "restart": f"{self.restart_s:g}s"}


@dataclass(frozen=True)
class Scenario:
    """Everything in a scenario file but its events (which join the topology's and
    `--event`'s: testbed.experiments.inputs)."""

    traces: tuple[LinkTrace, ...] = ()
    stragglers: tuple[Straggler, ...] = ()
    failures: tuple[WorkerLoss, ...] = ()
    recovery: Recovery = field(default_factory=Recovery)
    source: str | None = None

    def __bool__(self) -> bool:
        return bool(self.traces or self.stragglers or self.failures)

    def link_events(self) -> tuple[NetEvent, ...]:
        """The traces as network events (beneath the run's own events)."""
        return tuple(e for trace in self.traces for e in trace.events())

    def as_results(self) -> ScenarioRecord | None:
        """What results.json records of it (None: no scenario)."""
        if not self and self.source is None:
            return None
        return {"file": self.source,
                "traces": [t.describe() for t in self.traces],
                "stragglers": [s.as_raw() for s in self.stragglers],
                "failures": [f.as_raw() for f in self.failures],
                "recovery": self.recovery.as_raw()}


def load_scenario(path: Path, topology: Topology) -> tuple[Scenario, tuple[NetEvent, ...]]:
    """The scenario in `path` and its events, checked against the topology; a located
    InputError (file, key, problem) where something is wrong."""
    source = str(path)
    top = Fields(read_yaml(path), source, "", SECTIONS)
    top.check_keys()
    events = parse_events(top.raw("events", None), topology, source)
    base = path.parent
    traces = tuple(parse_trace(item, topology, source, key, base)
                   for key, item in top.items("traces"))
    stragglers = tuple(parse_straggler(item, topology, source, key)
                       for key, item in top.items("stragglers"))
    _check_stacking(stragglers, topology, source)
    failures = tuple(parse_failure(item, topology, source, key)
                     for key, item in top.items("failures"))
    _check_overlaps(failures, source)
    recovery = Recovery()
    section = top.section("recovery", keys=("detect", "restart"))
    if section is not None:
        recovery = Recovery(section.get("detect", _recovery_s, DEFAULT_DETECT_S),
                            section.get("restart", _recovery_s, DEFAULT_RESTART_S))
        section.done()
    top.done()
    return Scenario(traces, stragglers, failures, recovery, source), events


def parse_straggler(item: Any, topology: Topology, source: str | None, key: str
                    ) -> Straggler:
    fields = Fields(item, source, key, ("at", "for", "slower", "gpu", "dc"))
    fields.check_keys()
    at = fields.get("at", _seconds, 0.0)
    duration = fields.get("for", _seconds, None)
    slower = fields.get("slower", bounded(number, 1.0, MAX_SLOWER, lambda x: f"{x:g}"))
    given = [k for k in ("gpu", "dc") if fields.has(k)]
    if len(given) != 1:
        raise fields.error(None, "give exactly one of gpu (one GPU) or dc (all of its GPUs)")
    if given[0] == "gpu":
        gpu = fields.get("gpu", _gpu(topology))
        fields.done()
        return Straggler(at, duration, slower, gpu=gpu)
    dc = fields.get("dc", _dc(topology))
    fields.done()
    return Straggler(at, duration, slower, dc=dc)


def parse_failure(item: Any, topology: Topology, source: str | None, key: str
                  ) -> WorkerLoss:
    fields = Fields(item, source, key, ("at", "worker", "back"))
    fields.check_keys()
    at = fields.get("at", _run_time)
    worker = fields.get("worker", _gpu(topology))
    back = fields.get("back", _run_time, None)
    if back is not None and back <= at:
        raise fields.error("back", f"must be after `at` ({at:g} s), got {back:g} s "
                           "(both count from the start of training)")
    fields.done()
    return WorkerLoss(at, worker, back)


def _check_stacking(stragglers: tuple[Straggler, ...], topology: Topology, source: str
                    ) -> None:
    """Overlapping stragglers on one GPU (its own, its DC's) multiply: together at most
    MAX_SLOWER at any time."""
    by_dc: dict[str, list[int]] = {}
    by_gpu: dict[str, list[int]] = {}
    for i, straggler in enumerate(stragglers):
        if straggler.dc is not None:
            by_dc.setdefault(straggler.dc, []).append(i)
        elif straggler.gpu is not None:
            by_gpu.setdefault(straggler.gpu, []).append(i)
    groups = [(f"every GPU of {dc}", found) for dc, found in by_dc.items()]
    groups += [(gpu, sorted(found + by_dc.get(topology.dc_of(gpu), [])))
               for gpu, found in by_gpu.items()]
    for who, indices in groups:
        over = first_over([(i, stragglers[i].window()) for i in indices], MAX_SLOWER)
        if over is not None:
            index, at, product = over
            raise InputError(f"with the stragglers over it then, {who} computes {product:g} "
                             f"times slower from {at:g} s; overlapping stragglers multiply, "
                             f"to at most {MAX_SLOWER:g} together", source,
                             f"stragglers[{index}]")


def _check_overlaps(failures: tuple[WorkerLoss, ...], source: str) -> None:
    """A worker cannot be lost while it is lost."""
    for i, loss in enumerate(failures):
        for j, earlier in enumerate(failures[:i]):
            if earlier.worker != loss.worker:
                continue
            first, second = sorted((earlier, loss), key=lambda f: f.at_s)
            if first.back_s is None or second.at_s < first.back_s:
                raise InputError(f"{loss.worker} is already lost then (failures[{j}])",
                                 source, f"failures[{i}]")


def _seconds(value: Any) -> float:
    return parse_duration(value)


_recovery_s = bounded(parse_duration, 0.0, MAX_RECOVERY_S, format_duration)
_run_time = bounded(parse_duration, 0.0, MAX_RUN_S, lambda t: f"{t:g}s")
"""A time in the run: from its start to the longest a run lasts."""


def _gpu(topology: Topology) -> Any:
    def check(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError(f"expected a GPU name like east-0, got {value!r}")
        try:
            topology.gpu(value)
        except (KeyError, ValueError):
            raise ValueError(f"no GPU {value!r} in topology {topology.name!r}") from None
        return value

    return check


def _dc(topology: Topology) -> Any:
    def check(value: Any) -> str:
        names = [dc.name for dc in topology.datacenters]
        if value not in names:
            raise ValueError(f"no datacenter {value!r} (datacenters: {', '.join(names)})")
        return str(value)

    return check


def dilated(scenario: Scenario, k: float) -> Scenario:
    """The scenario on a clock K times slower (testbed.run.dilation); traces go with the
    events they become."""
    if k == 1:
        return scenario
    return dataclasses.replace(
        scenario, stragglers=tuple(s.dilated(k) for s in scenario.stragglers),
        failures=tuple(f.dilated(k) for f in scenario.failures),
        recovery=Recovery(scenario.recovery.detect_s * k, scenario.recovery.restart_s * k))
