"""A launch from start to end: the network up, one process per seat in its host's
namespace, the WAN's counters and the ranks sampled while they run, the scenario's link
changes and lost hosts at their times, every process gone (Ctrl-C, SIGTERM, a failed or
hung rank, the end) and the network down, whatever happens."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from testbed.common.units import human_rate, plural
from testbed.emulator.net.layout import build_layout
from testbed.emulator.net.link_changes import change_link
from testbed.emulator.net.network import Network, bring_up, tear_down
from testbed.emulator.net.sweep import RankGroups, sweep_namespaces
from testbed.emulator.runtime.coordinator.exits import exit_reason
from testbed.emulator.runtime.launch.cluster import Coordinator, Follower
from testbed.emulator.runtime.launch.counters import CounterSampler, wan_ports
from testbed.emulator.runtime.launch.rank_process import RankProcess
from testbed.emulator.runtime.launch.ranks import (
    Rendezvous,
    Seat,
    launch_env,
    seat_env,
    seats,
    torchrun_argv,
)
from testbed.emulator.runtime.launch.spec import STOP_GRACE_S, LaunchSpec
from testbed.emulator.runtime.wire.protocol import ProtocolError
from testbed.emulator.runtime.worker.join import JoinFailed
from testbed.errors import TestbedError
from testbed.report.launch_results import LaunchStatus, MetricPoint
from testbed.topology.cluster import Cluster
from testbed.topology.net_events import changes

Say = Callable[[str], None]
RANK_SAMPLE_S = 0.5
RATES_EVERY_S = 5.0


@dataclass
class LaunchRun:
    """What a launch did, for its results (testbed.emulator.runtime.launch.outcome)."""

    spec: LaunchSpec
    seats: list[Seat] = field(default_factory=list)
    ranks: list[RankProcess] = field(default_factory=list)
    network: Network | None = None
    master: str = ""
    status: LaunchStatus = "ok"
    error: str | None = None
    origin: float = 0.0
    """When the ranks started (monotonic)."""
    epoch: float = 0.0
    """The same moment in Unix time."""
    metrics: list[MetricPoint] = field(default_factory=list)
    sampler: CounterSampler | None = None
    lost: list[tuple[str, float]] = field(default_factory=list)
    """Each scenario failure applied: the GPU and its time."""
    applied_changes: list[tuple[float, str]] = field(default_factory=list)
    groups: RankGroups = field(default_factory=lambda: RankGroups(None))
    signal: int | None = None
    machines: dict[str, str] = field(default_factory=dict)
    """Across machines, on the coordinator: how each other machine's launch ended."""

    @property
    def end_s(self) -> float:
        ends = [r.ended for r in self.ranks if r.ended is not None]
        return max(ends) - self.origin if ends and self.origin else 0.0


class Launcher:
    def __init__(self, spec: LaunchSpec, say: Say, show: Say, verbose: bool = False) -> None:
        self.spec = spec
        self.say = say
        self.show = show
        """Where the ranks' output goes, each line with its rank (the console view)."""
        self.verbose = verbose
        self.run = LaunchRun(spec)
        self._stop = asyncio.Event()
        self._failed: RankProcess | None = None
        self.coordinator: Coordinator | None = None
        self.follower: Follower | None = None
        self._parting: asyncio.Task[None] | None = None
        """Across machines, the wait at the end: a signal cuts it short."""

    # --- the whole launch ------------------------------------------------------------

    async def launch(self) -> LaunchRun:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(RuntimeError, ValueError):
                loop.add_signal_handler(signum, self._on_signal, signum)
        try:
            self.run.network = await _finished(asyncio.to_thread(
                bring_up, self.spec.topology, self.spec.shaper, self.say, False, 0, (),
                self.spec.cluster, self.spec.machine))
            try:
                if not self._stop.is_set():
                    await self._go(self.run.network)
            finally:
                await _finished(asyncio.to_thread(self._clean_up))
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(RuntimeError, ValueError):
                    loop.remove_signal_handler(signum)
        if self.run.signal is not None:
            self.run.status, self.run.error = "interrupted", "interrupted"
        return self.run

    def _on_signal(self, signum: int) -> None:
        if self.run.signal is None:
            self.run.signal = signum
            self.say("stopping: every rank's processes, then the network")
        self._stop.set()
        if self._parting is not None:
            self._parting.cancel()

    async def _go(self, network: Network) -> None:
        spec, run = self.spec, self.run
        run.groups = RankGroups.make(network.state.run_id)
        network.state.info["launch"] = True  # `down` sweeps its namespaces and cgroup
        if run.groups.root is not None:
            network.state.info["cgroup"] = str(run.groups.root)
        network.state.save()
        everyone = seats(list(spec.hosts), spec.topology, spec.per)
        whole = build_layout(spec.topology, network.layout.slot)
        here = network.layout.router_dcs
        run.seats = [s for s in everyone if s.dc in here]  # a machine's share: its own
        master = whole.node(everyone[0].host).address
        # every machine of a cluster names the rendezvous alike, without talking
        run_id = f"testbed-{spec.topology.name}-{whole.slot}" if spec.cluster else \
            f"testbed-{network.state.run_id}"
        meet = Rendezvous(master, spec.master_port, run_id=run_id)
        run.master = f"{master}:{spec.master_port}"
        spec.out.joinpath("ranks").mkdir(parents=True, exist_ok=True)
        if spec.cluster is not None and not await self._together(spec.cluster):
            return
        run.origin, run.epoch = time.monotonic(), time.time()
        run.sampler = CounterSampler(wan_ports(network), run.origin, spec.sample_s)
        run.sampler.begin()
        kind = "node" if spec.per == "dc" else "rank"
        how = f"a torchrun per {spec.per}" if spec.torchrun else f"one per {spec.per}"
        share = f" of {len(everyone)} (this machine's share)" if spec.cluster else ""
        self.say(f"starting {plural(len(run.seats), kind)}{share} ({how}); MASTER_ADDR="
                 f"{master} (rank 0, {everyone[0].host})")
        for seat in run.seats:
            rank = RankProcess(seat, f"{kind}-{seat.index}",
                               f"[{seat.index} {seat.host if spec.per == 'host' else seat.dc}]",
                               spec.out / "ranks" / f"{kind}-{seat.index}.log",
                               spec.out / "ranks" / f"{kind}-{seat.index}.metrics.jsonl")
            env = {**launch_env(os.environ), **seat_env(seat, everyone, meet, spec.per,
                                            str(rank.metrics_path))}
            argv = list(spec.command)
            if spec.torchrun:
                argv = [*torchrun_argv(seat, everyone, meet, network.address_of(seat.host),
                                       spec.max_restarts, sys.executable), *argv]
            record = await rank.start(argv, network.netns_of(seat.host), env, run.groups)
            network.state.processes.append(record)
            network.state.save()  # `testbed down` finds it if this launch is killed
            run.ranks.append(rank)
        held = asyncio.create_task(self._held()) if self.follower else None
        await self._watch()
        if held is not None:
            held.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await held
        self._parting = asyncio.ensure_future(self._apart())
        try:
            await self._parting
        except asyncio.CancelledError:
            if self.coordinator is not None:
                await self.coordinator.close()

    async def _together(self, cluster: Cluster) -> bool:
        """Across machines: every machine's share up before any rank starts (False: the
        launch failed, its error said)."""
        spec, run = self.spec, self.run
        assert spec.machine is not None
        try:
            if spec.machine == cluster.coordinator:
                self.coordinator = Coordinator(cluster, spec.machine, spec.secret, self.say)
                await self.coordinator.gather(spec.join_timeout_s)
                await self.coordinator.start()
            else:
                self.follower = Follower(cluster, spec.machine, spec.secret)
                self.say(f"joining the coordinator, machine {cluster.coordinator}")
                await self.follower.join()
        except (TimeoutError, JoinFailed, ProtocolError, OSError, TestbedError) as exc:
            run.status, run.error = "failed", str(exc)
            self.say(f"launch across machines: {exc}")
            if self.coordinator is not None:
                await self.coordinator.close()
            return False
        return not self._stop.is_set()

    async def _held(self) -> None:
        """Another machine's: the coordinator closing the connection while this one's
        ranks run ends them (it was stopped, or it is gone)."""
        assert self.follower is not None
        await self.follower.gone()
        if any(r.running for r in self.run.ranks):
            cluster = self.spec.cluster
            self.run.status = "interrupted"
            self.run.error = (f"the coordinator, machine "
                              f"{cluster.coordinator if cluster else '?'}, ended the launch")
            self.say(self.run.error)
            self._stop.set()

    async def _apart(self) -> None:
        """Across machines, at the end: the coordinator lets every share go once every
        machine's ranks have ended (at once if its own launch did not end well); another
        machine says it is done and holds its share until let go."""
        status = "interrupted" if self.run.signal is not None else self.run.status
        if self.coordinator is not None:
            if status != "ok":
                await self.coordinator.close()
                return
            self.say("waiting for the other machines' ranks to end")
            for name, ended in (await self.coordinator.finish()).items():
                self.run.machines[name] = ended
        elif self.follower is not None:
            self.say("holding this machine's share until the coordinator lets it go")
            await self.follower.ended(status)

    async def _watch(self) -> None:
        """Until every rank has ended, or the launch is stopped (a signal, a failed rank
        after the others' grace, --timeout)."""
        run = self.run
        pumps = [asyncio.create_task(r.pump(self.show, self._metric, run.origin, run.epoch))
                 for r in run.ranks]
        waits = [asyncio.create_task(self._wait(r)) for r in run.ranks]
        helpers = [asyncio.create_task(t) for t in
                   (self._sample(), self._events(), self._losses(), self._timeout())]
        everyone = asyncio.ensure_future(self._all(waits))
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait([everyone, stopped], return_when=asyncio.FIRST_COMPLETED)
            if not everyone.done():
                await self._stop_all("stopped" if run.status != "timed_out" else "timed_out")
                await asyncio.wait({everyone}, timeout=STOP_GRACE_S + 5)
        finally:
            for task in [*helpers, stopped]:
                task.cancel()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(asyncio.gather(*pumps, return_exceptions=True), 3.0)
            for task in [*pumps, *waits]:
                task.cancel()
            for rank in run.ranks:
                with contextlib.suppress(Exception):
                    for point in rank.new_metrics(run.origin, run.epoch):
                        self._metric(point)
                rank.close()

    @staticmethod
    async def _all(waits: list[asyncio.Task[None]]) -> bool:
        await asyncio.gather(*waits)
        return True

    async def _wait(self, rank: RankProcess) -> None:
        code = await rank.wait()
        if rank.end is None:
            rank.end = "exited"
        who = f"{rank.name} ({rank.seat.host})"
        if rank.end == "exited" and code != 0 and self._failed is None:
            self._failed = rank
            self.run.status = "failed"
            self.run.error = f"{who} {exit_reason(code)}"
            self.say(f"{who} {exit_reason(code)}; the others have {self.spec.grace_s:g} s "
                     "to end by themselves")
            asyncio.get_running_loop().call_later(self.spec.grace_s, self._stop.set)
        elif self.verbose or code != 0:
            self.say(f"{who} {exit_reason(code)} ({rank.end})")

    async def _stop_all(self, why: str) -> None:
        """SIGTERM to every rank's processes, SIGKILL to what is left STOP_GRACE_S later."""
        run = self.run
        live = [r for r in run.ranks if r.running]
        for rank in live:
            rank.kill(run.groups, signal.SIGTERM, why)  # type: ignore[arg-type]
        deadline = time.monotonic() + STOP_GRACE_S
        while any(r.running for r in live) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for rank in run.ranks:
            rank.kill(run.groups, signal.SIGKILL, why)  # type: ignore[arg-type]

    # --- while the ranks run ---------------------------------------------------------

    def _metric(self, point: MetricPoint) -> None:
        self.run.metrics.append(point)

    async def _sample(self) -> None:
        run, last_rates = self.run, time.monotonic()
        while True:
            await asyncio.sleep(RANK_SAMPLE_S)
            for rank in run.ranks:
                rank.sample(run.groups, self.spec.torchrun or self.spec.per == "dc")
                for point in rank.new_metrics(run.origin, run.epoch):
                    self._metric(point)
            if self.verbose and time.monotonic() - last_rates >= RATES_EVERY_S:
                last_rates = time.monotonic()
                self.say(self._rates())

    def _rates(self) -> str:
        sampler = self.run.sampler
        parts = []
        for link, samples in (sampler.samples.items() if sampler else ()):
            recent = samples[-6:]
            if len(recent) > 1 and recent[-1].t > recent[0].t:
                bps = (recent[-1].bytes - recent[0].bytes) * 8 / (recent[-1].t - recent[0].t)
                parts.append(f"{link} {human_rate(bps)}")
        return "wan: " + (", ".join(parts) or "no counters yet")

    async def _events(self) -> None:
        """The network events and link traces, at their times."""
        run, network = self.run, self.run.network
        assert network is not None
        for change in changes(self.spec.events, self.spec.topology):
            delay = run.origin + change.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if change.event is not None and change.event.trace is None:
                verb = "ends" if change.revert else "starts"
                self.say(f"network event {verb}: {change.event.describe()}")
            try:
                await asyncio.to_thread(change_link, network, change.a, change.b,
                                        change.latency_s, change.bandwidth_bps, change.loss,
                                        change.one_way)
            except (TestbedError, OSError) as exc:
                self.run.status, self.run.error = "failed", f"a network event could not " \
                    f"be applied: {exc}"
                self._stop.set()
                return
            run.applied_changes.append((change.at_s, f"{change.a}>{change.b}"))

    async def _losses(self) -> None:
        """The scenario's failures: the host is lost, its rank's processes killed
        (SIGKILL, as a machine that is gone takes them); what the program does about it
        is the program's."""
        run = self.run
        for loss in sorted(self.spec.scenario.failures, key=lambda f: f.at_s):
            rank = next((r for r in run.ranks if loss.worker in r.seat.gpus), None)
            if rank is None:
                continue
            delay = run.origin + loss.at_s - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if not rank.running:
                continue
            self.say(f"host {loss.worker} lost at {loss.at_s:g} s (scenario): {rank.name}'s "
                     "processes killed")
            rank.kill(run.groups, signal.SIGKILL, "lost")
            run.lost.append((loss.worker, loss.at_s))

    async def _timeout(self) -> None:
        if self.spec.timeout_s is None:
            return
        await asyncio.sleep(self.spec.timeout_s)
        hung = [r.name for r in self.run.ranks if r.running]
        self.run.status = "timed_out"
        self.run.error = (f"--timeout {self.spec.timeout_s:g} s ran out with "
                          f"{', '.join(hung)} still running")
        self.say(self.run.error)
        self._stop.set()

    # --- the end ---------------------------------------------------------------------

    def _clean_up(self) -> None:
        """The counters' last sample, every process of every rank, the network."""
        run = self.run
        if run.sampler is not None:
            run.sampler.end()
        for rank in run.ranks:
            rank.kill(run.groups, signal.SIGKILL, "stopped")
            rank.cpu_total = rank.cpu_s(run.groups)
        if run.network is not None:
            sweep_namespaces(run.network.state.namespaces)
        for problem in run.groups.remove():
            self.say(f"teardown: {problem}")
        if run.network is not None:
            for problem in tear_down(run.network):
                self.say(f"teardown: {problem}")


async def _finished(work: asyncio.Future[Network] | asyncio.Future[None] | Any) -> Any:
    """Await `work` to its end even when this task is cancelled (a thread cannot be)."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        return await task
