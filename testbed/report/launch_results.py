"""results.json of `testbed launch` as types: a kind of its own (`"kind": "launch"`), for
a program testbed did not write. It has no plan and no spans; what it has is measured
from outside the program (the shaper's counters, each rank's processes) and what the
program chose to report (its metric lines). launch.schema.json beside this module is
generated from these types (`python -m testbed.report.results_schema`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal, NotRequired, TypedDict

from testbed.common.codec import OMITTED, OPEN
from testbed.metrics.loss import LossPoint, TimeToLoss
from testbed.report.run_results import Versions
from testbed.scenario.scenario import ScenarioRecord
from testbed.topology.net_events import EventEntry

LAUNCH_SCHEMA_VERSION = 1
LaunchStatus = Literal["ok", "failed", "interrupted", "timed_out"]
"""ok: every rank exited 0 (or was lost to the scenario and the rest went on to exit 0);
failed: a rank exited otherwise; interrupted: Ctrl-C, SIGTERM or `testbed down`;
timed_out: --timeout ran out first."""
RankEnd = Literal["exited", "lost", "stopped", "timed_out"]
"""How a rank's process ended: by itself; killed at a scenario's failure (its host
lost); stopped by the launch (Ctrl-C, another rank's failure); killed at --timeout."""


@dataclass(frozen=True)
class LinkUse:
    """One WAN link direction over the launch, from the shaper's counters."""

    link: str
    """`east>west`: the direction's sending and receiving DC."""
    rate_bps: float
    """Its configured rate (the topology's)."""
    bytes: int
    """TCP payload that crossed it: wire bytes less each packet's headers
    (testbed.metrics.link_counters)."""
    wire_bytes: int
    """IP bytes as the shaper sent them on: headers, ACKs and retransmissions included."""
    packets: int
    drops: int
    """Packets its queue dropped."""
    peak_bps: float | None
    """The highest rate in one sampling interval (wire bytes)."""
    peak_utilization: float | None
    mean_utilization: float | None
    """Wire bytes over what the rate could move in the launch's length."""


@dataclass(frozen=True)
class LaunchWan:
    bytes: int
    """TCP payload over every WAN direction: comparable with a testbed run's `wan.bytes`
    (its messages' bytes)."""
    wire_bytes: int
    utilization: float | None
    """Wire bytes over the capacity of the directions that carried traffic, over the
    launch's length."""
    peak_utilization: float | None
    """The highest of the directions' peaks."""
    sample_s: float
    """How often the counters were read."""
    links: list[LinkUse]
    counters_error: str | None = None
    """Why the counters stopped being read, if they did."""


@dataclass(frozen=True)
class RankOutcome:
    """One process the launch started (a rank; per DC, a node) and what became of it."""

    rank: int
    host: str
    dc: str
    gpus: list[str]
    end: RankEnd
    exit_code: int | None
    """Its exit status; negative: killed by that signal."""
    signal: str | None
    """The signal's name, where one ended it."""
    wall_s: float
    cpu_s: float | None
    """CPU of every process it started (cgroup), or of those seen while it ran."""
    peak_memory_bytes: int | None
    """The most its processes held resident together, as sampled."""
    log: str
    """Its stdout and stderr, relative to the results directory."""
    restarts: int | None = field(default=None, metadata=OMITTED)
    """Under --torchrun: times torchrun restarted its workers (TORCHELASTIC_RESTART_COUNT
    of the last ones seen)."""
    torch_ranks: list[int] | None = field(default=None, metadata=OMITTED)
    """Under --torchrun or per DC: the RANKs torch gave the processes it started."""


class LaunchCluster(TypedDict):
    """A launch across machines: the cluster, this machine, and on the coordinator how
    each other machine's launch ended."""

    name: str
    machine: str | None
    machines: NotRequired[dict[str, str]]


class MetricPoint(TypedDict):
    """One line of the program's own metrics (`TESTBED_METRIC {json}` on its output, or a
    JSON line in $TESTBED_METRICS)."""

    rank: int
    time_s: float
    """Seconds since the launch started the program (the line's own `time`, Unix
    seconds, where it gave one; else when the launch read it)."""
    step: int | None
    values: dict[str, float | None]


@dataclass(frozen=True)
class LaunchClock:
    """What the times mean: this machine's compute, the network's real time."""

    compute: str
    network: str
    dilation: int


@dataclass(frozen=True)
class LaunchResults:
    """One launch's results.json."""

    schema_version: int
    kind: Literal["launch"]
    topology: str
    command: list[str]
    per: Literal["host", "dc"]
    torchrun: bool
    placement: str
    """`file`, a policy's name, or the file the rank order came from."""
    hosts: list[str]
    """The GPU hosts in rank order."""
    master: str
    """MASTER_ADDR:MASTER_PORT, rank 0's address in the emulated network."""
    shaper: str | None
    status: LaunchStatus
    error: str | None
    wall_s: float | None
    """From the ranks' start to the last one's end."""
    clock: LaunchClock
    wan: LaunchWan
    outcomes: list[RankOutcome]
    metrics: list[MetricPoint]
    loss_curve: list[LossPoint] | None
    """Each step's loss (mean over the ranks that reported one) at the time the last of
    them reported it, from the program's metric lines."""
    time_to_loss: TimeToLoss | None
    events: list[Annotated[EventEntry, OPEN]]
    scenario: Annotated[ScenarioRecord, OPEN] | None
    versions: Versions
    cluster: Annotated[LaunchCluster, OPEN] | None = field(default=None, metadata=OMITTED)


def launch_summary(results: LaunchResults) -> list[str]:
    """What `testbed launch` prints at its end (and `testbed show` again): each rank's
    outcome, each WAN direction that carried traffic."""
    from testbed.common.units import human_bytes

    lines = []
    for rank in results.outcomes:
        code = "" if rank.exit_code is None else f" exit {rank.exit_code}"
        cpu = f", {rank.cpu_s:.1f} s CPU" if rank.cpu_s is not None else ""
        lines.append(f"rank {rank.rank} {rank.host}: {rank.end}{code}, {rank.wall_s:.1f} s{cpu}")
    for link in results.wan.links:
        if link.wire_bytes:
            peak = f", peak {link.peak_utilization:.0%}" if link.peak_utilization else ""
            lines.append(f"wan {link.link}: {human_bytes(link.bytes)} payload "
                         f"({human_bytes(link.wire_bytes)} on the wire){peak}")
    if results.time_to_loss is not None:
        from testbed.metrics.loss import time_to_loss_text

        lines.append(f"time to loss: {time_to_loss_text(results.time_to_loss)}")
    lines.append(f"status {results.status}" + (f": {results.error}" if results.error else ""))
    return lines
