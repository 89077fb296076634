"""One process a launch starts, from its start in a host's namespace to its end: its
output to its own log, to the console with its rank before each line, and its metric
lines out; its processes' memory and CPU sampled; signals to all of it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from testbed.common.owners import process_start_ticks
from testbed.emulator.net.state import ProcessRecord
from testbed.emulator.net.sweep import RankGroups
from testbed.emulator.runtime.coordinator.exits import resident_bytes
from testbed.emulator.runtime.launch.metric_lines import metric_in_output, parse_metric
from testbed.emulator.runtime.launch.ranks import Seat
from testbed.report.launch_results import MetricPoint, RankEnd

LINE_LIMIT = 1 << 20
"""Longest line read whole from a program's output (longer ones come in pieces)."""
BECOME_HOST = 'hostname "$0" && { [ -z "$1" ] || echo $$ > "$1"; } && shift && exec "$@"'
"""The rank's first words, in a UTS namespace of its own (`unshare --uts`): its host's
name as its host name (as each machine of a real cluster has its own: torch, torchrun and
torchft advertise the address it resolves to, which the namespace's hosts file gives),
its cgroup joined (so that every process the rank starts is in it from the first), then
it becomes the rank."""
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class RankProcess:
    seat: Seat
    name: str
    """`rank-3`, or per DC `node-1`: its log's and group's name."""
    label: str
    """What the console puts before each of its lines."""
    log_path: Path
    metrics_path: Path
    process: asyncio.subprocess.Process | None = None
    started: float = 0.0
    ended: float | None = None
    end: RankEnd | None = None
    """Set by whoever ends it (the launch); `exited` if it ended by itself."""
    peak_memory: int = 0
    cpu_seen: dict[int, float] = field(default_factory=dict)
    """CPU seconds of each process seen (where no cgroup counts them)."""
    restarts: int | None = None
    cpu_total: float | None = None
    """Its group's CPU, read as the launch ends (before the group goes)."""
    torch_ranks: set[int] = field(default_factory=set)
    _metrics_at: int = 0
    _log: TextIO | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.returncode is None

    async def start(self, argv: list[str], netns: str, env: Mapping[str, str],
                    groups: RankGroups) -> ProcessRecord:
        """Start it in `netns` (its cgroup joined before it runs a line of its own)."""
        procs = groups.procs_file(self.name)
        inside = ["unshare", "--uts", "sh", "-c", BECOME_HOST, self.seat.host,
                  "" if procs is None else str(procs), "ip", "netns", "exec", netns, *argv]
        self._log = open(self.log_path, "w", encoding="utf-8", errors="replace")  # noqa: SIM115
        self.process = await asyncio.create_subprocess_exec(
            *inside, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, limit=LINE_LIMIT)
        self.started = time.monotonic()
        pid = self.process.pid
        return ProcessRecord(pid, process_start_ticks(pid) or 0, f"launch:{self.name}")

    async def pump(self, show: Callable[[str], None], on_metric: Callable[[MetricPoint], None],
                   origin: float, epoch: float) -> None:
        """Its output until it closes both streams: each line to its log and, with its
        label, to `show`; metric lines to `on_metric` too."""
        assert self.process is not None and self.process.stdout and self.process.stderr

        async def read(stream: asyncio.StreamReader, metrics: bool) -> None:
            while True:
                try:
                    raw = await stream.readline()
                except ValueError:  # a line past LINE_LIMIT: what there is of it
                    raw = await stream.read(LINE_LIMIT)
                if not raw:
                    return
                line = raw.decode(errors="replace").rstrip("\n")
                if self._log is not None:
                    self._log.write(line + "\n")
                    self._log.flush()
                show(f"{self.label} {line}")
                point = metric_in_output(line, self.seat.index, time.monotonic() - origin,
                                         epoch) if metrics else None
                if point is not None:
                    on_metric(point)

        await asyncio.gather(read(self.process.stdout, True), read(self.process.stderr, False))

    def new_metrics(self, origin: float, epoch: float) -> list[MetricPoint]:
        """Lines the program added to its $TESTBED_METRICS file since last read."""
        try:
            with open(self.metrics_path, "rb") as handle:
                handle.seek(self._metrics_at)
                data = handle.read()
        except OSError:
            return []
        whole = data.rpartition(b"\n")[0]
        if not whole:
            return []
        self._metrics_at += len(whole) + 1
        now = time.monotonic() - origin
        found = (parse_metric(line.decode(errors="replace"), self.seat.index, now, epoch)
                 for line in whole.split(b"\n") if line.strip())
        return [p for p in found if p is not None]

    def sample(self, groups: RankGroups, torchrun: bool) -> None:
        """Its processes' memory together (the peak kept), their CPU where no group counts
        it, and what torch told the processes it started (their RANK, restarts)."""
        if not self.running:
            return
        pids = groups.pids(self.name, self.pid)
        self.peak_memory = max(self.peak_memory, sum(resident_bytes(p) or 0 for p in pids))
        if groups.root is None:
            for pid in pids:
                used = _cpu_s(pid)
                if used is not None:
                    self.cpu_seen[pid] = max(self.cpu_seen.get(pid, 0.0), used)
        if torchrun:
            for pid in pids:
                env = _environment(pid)
                if "RANK" in env and env.get("RANK", "").isdigit():
                    self.torch_ranks.add(int(env["RANK"]))
                    count = env.get("TORCHELASTIC_RESTART_COUNT", "")
                    if count.isdigit():
                        self.restarts = max(self.restarts or 0, int(count))

    def cpu_s(self, groups: RankGroups) -> float | None:
        counted = groups.cpu_s(self.name) if self.cpu_total is None else self.cpu_total
        if counted is not None:
            return counted
        return sum(self.cpu_seen.values()) if self.cpu_seen else None

    def kill(self, groups: RankGroups, signum: int, why: RankEnd) -> None:
        """`signum` to all of it; `why` it ended, if it had not ended already."""
        if self.running and self.end is None:
            self.end = why
        groups.signal(self.name, signum, self.pid)

    async def wait(self) -> int:
        assert self.process is not None
        code = await self.process.wait()
        if self.ended is None:
            self.ended = time.monotonic()
        return code

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _cpu_s(pid: int) -> float | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS
    except (OSError, ValueError, IndexError):
        return None


def _environment(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def exit_signal(code: int | None) -> str | None:
    """The name of the signal a negative exit status stands for."""
    if code is None or code >= 0:
        return None
    with contextlib.suppress(ValueError):
        return signal.Signals(-code).name
    return f"signal {-code}"
