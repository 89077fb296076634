"""Whether this machine, not the represented network, set an emulated run's pace.

Four signals, each of which the simulator has no counterpart for: how busy the machine's
cores were during training, how late the workers' event loops woke (a late loop delays
sends, receives and grants), how late the delay lines released packets, and how much of
its busiest worker's time its own actions' CPU took (each lies on that worker's path from
one message to the next, however idle the other cores). A run whose signals pass the
thresholds below is reported as `cpu_bound`, with a dilation to try.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from testbed.common.stats import percentile
from testbed.run.dilation import MAX_DILATION, PATH_LIMIT

BUSY_LIMIT = 0.9
"""Share of all cores busy above which the machine, not the network, sets the pace."""
LAG_LIMIT_S = 0.005
"""Event-loop lateness (p99, represented time) above which transfers start late."""
LATE_LIMIT_S = 0.001
"""Mean delay-line lateness (represented time) above which latencies are not what the
topology says."""
TARGET_BUSY = 0.6
"""The busy share a suggested dilation aims for."""


@dataclass(frozen=True)
class CpuSample:
    busy: int
    total: int
    niced: int = 0
    """Of `busy`, the time of processes that yield to ours (nice above 0)."""


def read_cpu(stat: Path = Path("/proc/stat")) -> CpuSample:
    """Jiffies spent busy and in total over all cores since boot."""
    fields = [int(x) for x in stat.read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return CpuSample(sum(fields) - idle, sum(fields), fields[1])


def process_cpu_ticks(pids: Iterable[int]) -> int:
    """User plus system clock ticks the processes (and their reaped children) have used."""
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        total += sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
    return total


def cpu_per_span(ticks: int | None, spans: int) -> float | None:
    """CPU seconds the workers used per span they reported."""
    return ticks / os.sysconf("SC_CLK_TCK") / spans if ticks is not None and spans else None


def busy_share(before: CpuSample, after: CpuSample) -> float:
    total = after.total - before.total
    return (after.busy - before.busy) / total if total > 0 else 0.0


def busy_now(seconds: float = 1.0) -> float:
    """Share of all cores busy over the next `seconds` with work that does not yield to
    ours (before a run: everyone else's; niced work is left out)."""
    before = read_cpu()
    time.sleep(seconds)
    after = read_cpu()
    return busy_share(CpuSample(before.busy - before.niced, before.total),
                      CpuSample(after.busy - after.niced, after.total))


@dataclass(frozen=True)
class Health:
    cpu_busy: float
    """Share of all cores busy during training."""
    workers_cpu: float | None
    """Of that, the share the worker processes used (the rest: delay lines, the kernel's
    forwarding, the coordinator, anything else on the machine)."""
    lag_p99_s: float
    """Workers' event-loop lateness, p99 over iterations and workers, represented time."""
    delay_line_late_mean_s: float | None
    delay_line_late_max_s: float | None
    cpu_bound: bool
    reasons: tuple[str, ...]
    dilation: int
    suggested_dilation: int
    """What to try next: at most MAX_DILATION."""
    span_cpu_s: float | None = None
    """The workers' CPU seconds per span they recorded: what each action cost them on
    this machine during training (the calibration's figure, measured in the run)."""
    needed_dilation: int = 0
    """What the run needed to keep pace, past MAX_DILATION too (0: the suggestion)."""
    path_share: float | None = None
    """The share of its busiest worker's time its actions' CPU took (the calibrated CPU
    per action times that worker's spans per second of the machine's time); None where
    not weighed."""

    def behind(self, measured_s: float | None, predicted_s: float | None) -> Health:
        """The same, its suggestion covering how much longer the run's iterations took
        than the simulator's (`suggest_dilation`'s stretch), where the machine set the
        pace and both are known."""
        if not (self.cpu_bound and measured_s and predicted_s):
            return self
        needed = max(self.needed_dilation,
                     needed_dilation(self.dilation, self.cpu_busy, measured_s / predicted_s))
        return replace(self, suggested_dilation=min(MAX_DILATION, needed),
                       needed_dilation=needed)

    def warning(self) -> str | None:
        if not self.cpu_bound:
            return None
        said = (f"this machine set the pace of the run ({'; '.join(self.reasons)}); its "
                "times are this machine's, not the network's: ")
        needed = self.needed_dilation or self.suggested_dilation
        if needed <= MAX_DILATION:
            return f"{said}try --dilation {self.suggested_dilation}"
        if self.dilation < MAX_DILATION:
            return (f"{said}try --dilation {MAX_DILATION}, the most allowed, though it needs "
                    f"about {needed:,}: even that may not be enough (fewer GPUs, or "
                    "`testbed simulate`)")
        return (f"{said}it ran at --dilation {MAX_DILATION}, the most allowed, and needs "
                f"about {needed:,}: use fewer GPUs, or `testbed simulate`")


def delay_line_lateness(stats: Mapping[str, Mapping[str, Any]]) -> tuple[float, float] | None:
    """(mean, max) seconds late over every delay line's packets, or None without any."""
    packets = late_sum = 0.0
    late_max = 0.0
    for line in stats.values():
        for port in line.get("ports", {}).values():
            n = float(port.get("packets_out", 0))
            packets += n
            late_sum += n * float(port.get("late_mean_ms", 0.0)) / 1e3
            late_max = max(late_max, float(port.get("late_max_ms", 0.0)) / 1e3)
    return (late_sum / packets, late_max) if packets else None


def assess(cpu_busy: float, lags_s: Iterable[float], lateness: tuple[float, float] | None,
           dilation: int = 1, workers_cpu: float | None = None,
           span_cpu_s: float | None = None, path_share: float | None = None) -> Health:
    """Judge a run from its signals; real-time figures are divided by the dilation
    (`path_share` is already the run's own, at its dilation)."""
    lag = (percentile(lags_s, 0.99) or 0.0) / dilation
    late = None if lateness is None else (lateness[0] / dilation, lateness[1] / dilation)
    reasons = []
    if cpu_busy >= BUSY_LIMIT:
        reasons.append(f"cores {cpu_busy:.0%} busy")
    if lag >= LAG_LIMIT_S:
        reasons.append(f"event loops {lag * 1e3:.1f} ms late (p99)")
    if late is not None and late[0] >= LATE_LIMIT_S:
        reasons.append(f"delay lines {late[0] * 1e3:.1f} ms late on average")
    own = 0
    if path_share is not None and path_share >= PATH_LIMIT:
        reasons.append(f"the busiest worker's own actions took {path_share:.1%} of its time")
        own = math.ceil(dilation * path_share / PATH_LIMIT - 1e-9)
    bound = bool(reasons)
    needed = max(own, needed_dilation(dilation, cpu_busy)) if bound else dilation
    return Health(cpu_busy, workers_cpu, lag, None if late is None else late[0],
                  None if late is None else late[1], bound, tuple(reasons), dilation,
                  min(MAX_DILATION, needed), span_cpu_s, needed, path_share)


def assess_run(before: CpuSample, after: CpuSample, worker_ticks: int | None, spans: int,
               lags_s: Iterable[float], lateness: tuple[float, float] | None,
               dilation: int, busiest_spans_per_s: float = 0.0,
               action_cpu_s: float | None = None) -> Health:
    """Judge a run from the machine's CPU samples around its training, its workers' CPU
    ticks over it and the spans they reported (`assess`); `busiest_spans_per_s`: the
    spans per second (of the machine's time) of the worker with the most, each costing
    it `action_cpu_s` (None: its path not weighed)."""
    elapsed = after.total - before.total  # over all cores, in the same clock ticks
    workers = worker_ticks / elapsed if worker_ticks is not None and elapsed else None
    path = None if action_cpu_s is None else busiest_spans_per_s * action_cpu_s
    return assess(busy_share(before, after), lags_s, lateness, dilation, workers,
                  cpu_per_span(worker_ticks, spans), path)


def needed_dilation(dilation: int, cpu_busy: float, stretch: float = 1.0) -> int:
    """The dilation a machine-bound run needed: the CPU it used (its busy share times how
    much longer its iterations took than the simulator's, the time it needed to keep the
    represented pace) brought down to TARGET_BUSY, and at least one more."""
    return max(dilation + 1,
               math.ceil(dilation * max(1.0, stretch) * cpu_busy / TARGET_BUSY - 1e-9))


def suggest_dilation(dilation: int, cpu_busy: float, stretch: float = 1.0) -> int:
    """The dilation to try after a machine-bound run: what it needed, at most the most
    allowed (`--dilation 5096` was suggested, and refused)."""
    return min(MAX_DILATION, needed_dilation(dilation, cpu_busy, stretch))
