"""The coordinator's control logic without root or a network: local hosts, fake workers
that speak the real control protocol (tests/fake_worker.py) and misbehave on request."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import pytest

from testbed.emulator.runtime.coordinator.coordinator import Coordinator, RunFailed, RunOutcome
from testbed.emulator.runtime.coordinator.hosts import WanSocket
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.emulator.runtime.coordinator.signals import run_with_signals
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.plan.model import Plan
from testbed.policy import TrainingPolicy, Transfer, training_policy
from testbed.topology.model import Topology

from .conftest import TOPOLOGIES

ROOT = Path(__file__).resolve().parent.parent


class LocalHosts:
    """Hosts that are plain local processes: the fake worker in place of the real one."""

    def __init__(self, directory: Path, behaviours: Mapping[str, Any],
                 cgroups: Mapping[str, Path] | None = None) -> None:
        self.directory = directory
        self.behaviours = dict(behaviours)
        self.cgroups = dict(cgroups or {})
        """Host -> the cgroup its worker starts in."""
        self.up = False
        self.torn_down = False
        self.broken_because: str | None = None
        self.processes: list[asyncio.subprocess.Process] = []

    def bring_up(self, topology: Topology, decode_dcs: tuple[str, ...]) -> None:
        self.up = True

    def control_dir(self) -> Path:
        return self.directory

    def address_of(self, host: str) -> str:
        return "127.0.0.1"

    async def spawn(self, host: str, module: str, args: list[str], env: Mapping[str, str],
                    log: TextIO, name: str) -> asyncio.subprocess.Process:
        assert module == "testbed.emulator.runtime.worker.process"
        cgroup = self.cgroups.get(host)
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.fake_worker", *args, cwd=ROOT,
            env={**env, "FAKE_WORKERS": json.dumps(self.behaviours)},
            stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
            preexec_fn=None if cgroup is None else lambda: _join(cgroup))
        self.processes.append(process)
        return process

    async def launch(self, argv: list[str], netns: str | None, env: Mapping[str, str],
                     log: TextIO, name: str) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            *argv, env=dict(env), stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log)
        self.processes.append(process)
        return process

    def change_link(self, a: str, b: str, latency_s: float | None,
                    bandwidth_bps: float | None, loss: float | None,
                    one_way: bool = False) -> None:
        pass

    def broken(self) -> str | None:
        return self.broken_because

    def lateness(self) -> tuple[float, float] | None:
        return None

    def wan_sockets(self) -> list[WanSocket]:
        return []

    def shaper(self) -> str | None:
        return "none"

    def tear_down(self) -> list[str]:
        self.torn_down = True
        return []


def _join(cgroup: Path) -> None:
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))


class LowestReplicaFirst(TrainingPolicy):
    name = "lowest-replica-first"

    def plan(self, *args: Any) -> Plan:
        raise NotImplementedError

    def next_transfer(self, plan: Plan, link: tuple[str, str],
                      waiting: Sequence[Transfer]) -> Transfer:
        return min(waiting, key=lambda t: (t.replica, t.id))


def _run(tmp: Path, behaviours: Mapping[str, Any] | None = None,
         policy: TrainingPolicy | None = None, stall_timeout_s: float = 60,
         iterations: int = 3, broken_after: float | None = None,
         cgroups: Mapping[str, Path] | None = None
         ) -> tuple[Coordinator, LocalHosts, RunOutcome | BaseException]:
    inputs = load_inputs(TOPOLOGIES / "two-dc.yaml", sets=(f"iterations={iterations}",))
    chosen = training_policy("1f1b")
    plan = plan_with_simulator(chosen, inputs.topology, inputs.job)
    hosts = LocalHosts(tmp, behaviours or {}, cgroups)
    config = RunConfig(inputs.topology, inputs.job, plan, policy or chosen, "emulated",
                       tmp / "logs", stall_timeout_s=stall_timeout_s)
    coordinator = Coordinator(config, hosts, say=lambda _m: None)

    async def scenario() -> RunOutcome:
        if broken_after is not None:
            async def breaks() -> None:
                await asyncio.sleep(broken_after)
                hosts.broken_because = "the delay line for WAN link east-west exited"
            asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(breaks()))
        return await asyncio.wait_for(run_with_signals(coordinator), 60)

    try:
        result: RunOutcome | BaseException = asyncio.run(scenario())
    except RunFailed as exc:
        result = exc
    assert hosts.torn_down, "teardown must run whatever happened"
    assert all(p.returncode is not None for p in hosts.processes), "a worker outlived the run"
    return coordinator, hosts, result


def test_a_run_of_fake_workers_finishes_and_sums_their_losses(tmp_path: Path) -> None:
    coordinator, _, outcome = _run(tmp_path)
    assert isinstance(outcome, RunOutcome), outcome
    assert outcome.status == "ok"
    assert coordinator.plan.dp == 2 and len(coordinator.workers) == 4
    assert outcome.losses == {0: 2.0, 1: 2.0, 2: 2.0}  # four workers' 1.0, over dp 2
    assert all(w.finished for w in coordinator.workers)


def test_the_synchronized_model_s_losses_a_worker_reports_reach_the_outcome(
        tmp_path: Path) -> None:
    """A DiLoCo-family run's last stage of replica 0 reports them as it is done."""
    _, _, outcome = _run(tmp_path, {"west-1": {"synced": {"0": 5.5, "3": 4.25}}})
    assert isinstance(outcome, RunOutcome), outcome
    assert outcome.synced_losses == {0: 5.5, 3: 4.25}


def test_a_run_reports_its_workers_peak_memory(tmp_path: Path) -> None:
    """Each worker's high-water mark, read while it runs: west-1 held 96 MB more for a
    moment in its second iteration."""
    _, _, outcome = _run(tmp_path, {"west-1": {"grow_at": 1, "mb": 96, "release": True}})
    assert isinstance(outcome, RunOutcome) and outcome.memory is not None, outcome
    memory = outcome.memory
    assert memory.largest_worker == "west-1"
    assert memory.largest_worker_peak >= 96 * 2**20
    assert memory.workers_peak > memory.largest_worker_peak + 3 * 5 * 2**20  # three more
    assert memory.coordinator_peak > 0


def test_a_worker_dying_ends_the_run_naming_it(tmp_path: Path) -> None:
    coordinator, _, outcome = _run(tmp_path, {"west-1": {"die_at": 1}})
    assert isinstance(outcome, RunFailed)
    assert "west-1 (replica 1, stage 1) exited with code 3: fake crash in iteration 1" \
        in str(outcome)
    assert coordinator.outcome is not None and coordinator.outcome.status == "failed"
    assert 0 in coordinator.outcome.losses  # what was measured is kept


def test_a_killed_worker_is_named_with_its_signal(tmp_path: Path) -> None:
    _, _, outcome = _run(tmp_path, {"west-1": {"kill_at": 1}})
    assert isinstance(outcome, RunFailed)
    assert "worker west-1 (replica 1, stage 1) was killed by SIGKILL (exit code -9)" \
        in str(outcome), outcome


@pytest.fixture
def small_memory() -> Iterator[Path]:
    """A memory cgroup of 160 MiB without swap, beside this process's own (cgroup v1's
    memory controller, or v2 where the memory controller is on): root only."""
    if os.geteuid() != 0:
        pytest.skip("a memory cgroup needs root")
    own = Path("/proc/self/cgroup").read_text().splitlines()
    v2 = Path("/sys/fs/cgroup/cgroup.controllers")
    if v2.exists() and "memory" in v2.read_text().split():
        base, limits = Path("/sys/fs/cgroup"), ("memory.max", "memory.swap.max")
        relative = next(line.split(":", 2)[2] for line in own if line.startswith("0::"))
    else:
        base = Path("/sys/fs/cgroup/memory")
        limits = ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
        relative = next((line.split(":", 2)[2] for line in own
                         if line.split(":")[1] == "memory"), "/")
    group = base / relative.lstrip("/") / f"testbed-oom-{os.getpid()}"
    try:
        group.mkdir()
        for name, value in zip(limits, (160 * 2**20, 0 if v2.exists() else 160 * 2**20),
                               strict=True):
            with contextlib.suppress(FileNotFoundError):  # no swap accounting
                (group / name).write_text(str(value))
    except OSError as exc:
        pytest.skip(f"no memory cgroup to limit here: {exc}")
    try:
        yield group
    finally:
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_a_worker_killed_for_memory_is_named_so(tmp_path: Path, small_memory: Path) -> None:
    """A real OOM kill: the worker grows past its cgroup's limit."""
    _, _, outcome = _run(tmp_path, {"west-1": {"grow_at": 1, "mb": 400}},
                         cgroups={"west-1": small_memory})
    assert isinstance(outcome, RunFailed)
    message = str(outcome)
    assert "worker west-1 (replica 1, stage 1) was killed: out of memory (the kernel's OOM " \
        "killer, " in message, message
    resident = float(message.split("killer, ")[1].split(" MB")[0])
    # Sampled on its way to the 160 MiB limit, well short of the 400 MB it asked for; its
    # resident set also counts shared library pages charged to other cgroups, so it may
    # read a little above the limit.
    assert 20 <= resident < 400, message


def test_a_stall_names_the_worker_behind(tmp_path: Path) -> None:
    _, _, outcome = _run(tmp_path, {"east-0": {"stall_at": 1}}, stall_timeout_s=1.5)
    assert isinstance(outcome, RunFailed)
    assert "no progress for 1.5 s; stuck: east-0 (replica 0, stage 0) (in iteration 2)" \
        in str(outcome), outcome


def test_a_broken_network_ends_the_run_as_such(tmp_path: Path) -> None:
    _, _, outcome = _run(tmp_path, {"east-0": {"stall_at": 1}}, broken_after=0.5)
    assert isinstance(outcome, RunFailed)
    assert "delay line for WAN link east-west exited" in str(outcome)


@pytest.mark.parametrize(("policy", "expected"), [
    (LowestReplicaFirst(), ["a1", "b1", "a2"]),
    (training_policy("atlas", {"order": "fifo"}), ["a1", "a2", "b1"]),
])
def test_grants_follow_the_policy_one_at_a_time(tmp_path: Path, policy: TrainingPolicy,
                                                 expected: list[str]) -> None:
    """a1 takes the free link; a2 (replica 1) and b1 (replica 0) wait; when a1 is sent the
    policy picks the next."""
    order = tmp_path / "grants.json"
    wanted = [["a1", 1, 0], ["a2", 1, 1], ["b1", 0, 0]]
    _, _, outcome = _run(tmp_path, {"east-0": {"requests": wanted,
                                               "grants_to": str(order)}}, policy)
    assert isinstance(outcome, RunOutcome), outcome
    assert json.loads(order.read_text()) == expected


def test_a_killed_coordinator_leaves_no_worker(tmp_path: Path) -> None:
    """Cancelled mid-run (as by Ctrl-C): workers are stopped and the hosts torn down."""
    inputs = load_inputs(TOPOLOGIES / "two-dc.yaml", sets=("iterations=10000",))
    chosen = training_policy("1f1b")
    hosts = LocalHosts(tmp_path, {})
    config = RunConfig(inputs.topology, inputs.job, plan_with_simulator(chosen, inputs.topology,
                                                             inputs.job),
                       chosen, "emulated", tmp_path / "logs")
    coordinator = Coordinator(config, hosts, say=lambda _m: None)

    async def scenario() -> None:
        task = asyncio.ensure_future(coordinator.run())
        while not coordinator.telemetry.iterations_seen:
            await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(asyncio.wait_for(scenario(), 60))
    assert hosts.torn_down and coordinator.outcome is not None
    assert coordinator.outcome.status == "interrupted"
    assert all(p.returncode is not None for p in hosts.processes)
    assert not any(os.path.exists(f"/proc/{p.pid}") and p.returncode is None
                   for p in hosts.processes)


def test_why_a_process_ended_in_words(tmp_path: Path) -> None:
    from testbed.emulator.runtime.coordinator.exits import exit_reason, oom_kills, resident_bytes

    assert exit_reason(3) == "exited with code 3"
    assert exit_reason(-11) == "was killed by SIGSEGV (exit code -11)"
    assert exit_reason(-9) == "was killed by SIGKILL (exit code -9)"  # no count to go by
    assert exit_reason(-9, 4, 4, 2**30) == "was killed by SIGKILL (exit code -9)"
    assert exit_reason(-15, 4, 5) == "was killed by SIGTERM (exit code -15)"
    assert exit_reason(-9, 4, 5, 2_500_000_000) == (
        "was killed: out of memory (the kernel's OOM killer, 2.5 GB resident when last seen)")
    assert exit_reason(-9, 4, 5) == "was killed: out of memory (the kernel's OOM killer)"
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("pgfault 10\noom_kill 7\n")
    assert oom_kills(vmstat) == 7
    vmstat.write_text("pgfault 10\n")  # a kernel that does not count them
    assert oom_kills(vmstat) is None
    assert (resident_bytes(os.getpid()) or 0) > 1_000_000
    assert resident_bytes(2**22 + 7) is None
