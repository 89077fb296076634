"""What happens to an emulated run at set times from the start of training: network
events (and link traces' steps) change the live links, and a scenario's failure kills
the worker on the GPU it takes."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence

from testbed.emulator.net.network import Progress as Say
from testbed.emulator.runtime.coordinator.cluster_run import ClusterJoins
from testbed.emulator.runtime.coordinator.hosts import Hosts
from testbed.emulator.runtime.coordinator.pool import WorkerHandle
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.errors import TestbedError
from testbed.scenario.scenario import WorkerLoss
from testbed.topology.net_events import NetEvent, changes


class TimedChanges:
    def __init__(self, config: RunConfig, hosts: Hosts, joins: ClusterJoins | None,
                 say: Say, fail: Callable[[str], None]) -> None:
        self.config, self.hosts, self.joins, self.say, self.fail = (config, hosts, joins,
                                                                     say, fail)
        self.down: NetEvent | None = None
        """The network event that has a link down now, if one has."""
        self.lost: WorkerLoss | None = None
        """The scenario's failure that ended the run, if one did (of `config.losses`)."""

    async def apply_events(self, start: float) -> None:
        """Change the links at the events' times; a failure to apply one ends the run.
        A link trace's steps go without a word each."""
        for change in changes(self.config.events, self.config.topology):
            delay = start + change.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if change.event is not None and change.event.trace is None:
                verb = "ends" if change.revert else "starts"
                self.say(f"network event {verb}: {change.event.describe()}")
            try:
                await asyncio.to_thread(self.hosts.change_link, change.a, change.b,
                                        change.latency_s, change.bandwidth_bps, change.loss,
                                        change.one_way)
                if self.joins is not None:  # the directions other machines' routers send
                    await self.joins.change_link(change.a, change.b, change.latency_s,
                                                 change.bandwidth_bps, change.loss,
                                                 change.one_way)
            except (TestbedError, OSError) as exc:
                self.fail(f"network event {change.event.describe() if change.event else ''}"
                          f" could not be applied: {exc}")
                return
            if change.loss is not None:
                self.down = change.event if change.loss >= 1.0 else None

    async def lose_workers(self, start: float, workers: Sequence[WorkerHandle]) -> None:
        """The scenario's failures: at its time the worker on the lost GPU is killed
        (SIGKILL, as a machine that is gone takes it), and the run ends naming it; what
        follows is testbed.run.segments'. A GPU the plan does not use, or a worker that
        finished its iterations, is not missed."""
        by_gpu = {w.gpu: w for w in workers}
        for loss in sorted(self.config.losses, key=lambda f: f.at_s):
            worker = by_gpu.get(loss.worker)
            if worker is None or worker.process is None:
                continue
            delay = start + loss.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if worker.finished:
                continue
            self.lost = loss
            self.fail(f"worker {worker.describe()} lost at "
                      f"{loss.at_s / self.config.dilation:g} s (scenario failure)")
            with contextlib.suppress(ProcessLookupError):
                worker.process.kill()
            return
