"""A training run across machines, on this one machine: each "machine" is a network
namespace on a bridge (testbed.emulator.net.namespace_cluster); the other machine brings up its
share with `testbed net up --cluster` and runs the torchrun command the coordinator
prints, as a user would.

Needs root."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from testbed.common.choices import EmulatedCompute
from testbed.emulator.net.check import ping_rtts
from testbed.emulator.net.layout import build_layout, prefix_for
from testbed.emulator.net.namespace_cluster import namespace_machines
from testbed.emulator.net.slots import free_slot
from testbed.emulator.runtime.coordinator.coordinator import Coordinator, RunFailed
from testbed.emulator.runtime.coordinator.pool import STOP_GRACE_S
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.emulator.runtime.coordinator.signals import run_with_signals
from testbed.emulator.runtime.worker.compute.reference import merge_stages, train_one_process
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.plan.host_tcp import hosts_as_planned
from testbed.policy import training_policy
from testbed.topology.cluster import load_cluster
from testbed.topology.load import load_topology
from testbed.topology.seats import ClusterRun
from testbed.topology.secret_file import read_secret
from tests.conftest import machine_prefix

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("clean_host")]
ROOT = Path(__file__).resolve().parent.parent
TWO_DC = ROOT / "topologies" / "two-dc.yaml"
ON = "  on "


@pytest.fixture
def machines() -> Iterator[dict[str, str]]:
    with namespace_machines(["m1", "m2"], prefix=machine_prefix()) as made:
        yield {m.name: m.netns for m in made}


def _cluster(tmp_path: Path, machines: dict[str, str]) -> Path:
    secret = tmp_path / "secret"
    secret.write_text(secrets.token_hex(32))
    secret.chmod(0o600)
    path = tmp_path / "cluster.yaml"
    topology = load_topology(TWO_DC)
    slot = free_slot(lambda s: build_layout(topology, s))  # another suite may hold slot 0
    path.write_text(json.dumps({"secret": "secret", "slot": slot, "machines": [
        {"name": "m1", "address": "10.251.0.1", "netns": machines["m1"], "dcs": ["east"]},
        {"name": "m2", "address": "10.251.0.2", "netns": machines["m2"], "dcs": ["west"]},
    ]}))
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", "from testbed.cli.main import main; main()",
                           *args],
                          capture_output=True, text=True, timeout=120, check=False)


class OtherMachine:
    """Machine m2 as its user runs it: the command the coordinator prints for it."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.torchrun: subprocess.Popen[str] | None = None

    def say(self, line: str) -> None:
        self.lines.append(line)
        if line.startswith(ON + "m2: "):
            env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
            self.torchrun = subprocess.Popen(shlex.split(line[len(ON + "m2: "):]), env=env,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                             text=True, start_new_session=True)

    def output(self, wait_s: float = 30) -> str:
        """What its torchrun printed, once it has ended (killed if it had not)."""
        if self.torchrun is None:
            return ""
        if self.torchrun.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.torchrun.wait(timeout=wait_s)
        if self.torchrun.poll() is None:
            os.killpg(self.torchrun.pid, signal.SIGKILL)
        return self.torchrun.communicate(timeout=30)[0]


def _coordinator(tmp_path: Path, cluster_path: Path, other: OtherMachine,
                 compute: EmulatedCompute = "real", events: tuple[str, ...] = (),
                 join_timeout_s: float = 120, **sets: object) -> Coordinator:
    inputs = load_inputs(TWO_DC, sets=tuple(f"{k}={v}" for k, v in sets.items()),
                         events=events)
    chosen = training_policy("1f1b")
    plan = plan_with_simulator(chosen, inputs.topology, inputs.job)
    cluster = load_cluster(cluster_path, inputs.topology)
    across = ClusterRun(cluster, "m1", read_secret(cluster), join_timeout_s)
    config = RunConfig(hosts_as_planned(inputs.topology, plan), inputs.job, plan, chosen,
                       compute, tmp_path / "logs", stall_timeout_s=60, save_dir=tmp_path,
                       events=inputs.events, cluster=across)
    return Coordinator(config, say=other.say)


def test_two_machines_train_to_the_same_parameters_as_one(
        tmp_path: Path, machines: dict[str, str]) -> None:
    cluster = _cluster(tmp_path, machines)
    other = OtherMachine()
    coordinator = _coordinator(tmp_path, cluster, other, iterations=3)
    try:
        outcome = asyncio.run(run_with_signals(coordinator))
    finally:
        printed = other.output()
    assert outcome.status == "ok", other.lines
    assert other.torchrun is not None and other.torchrun.returncode == 0, printed
    assert any(line.startswith("machine m2: its share of the network is up")
               for line in other.lines)
    plan, job = coordinator.plan, coordinator.job
    assert {w.machine for w in coordinator.workers} == {"m1", "m2"}
    reference = train_one_process(job, plan.dp, plan.microbatches)
    for replica in range(plan.dp):
        stages = [torch.load(tmp_path / f"r{replica}-s{s}.pt") for s in range(plan.pp)]
        trained = merge_stages(stages, plan.layers)
        for name, value in reference.items():
            torch.testing.assert_close(trained[name], value, atol=2e-5, rtol=1e-4,
                                       msg=f"{name} of replica {replica}")


def _lose_m2_in_training(tmp_path: Path, machines: dict[str, str],
                        lose: Callable[[OtherMachine], None], wait_s: float) -> Coordinator:
    """A long run in which m2 is lost (`lose`) once the first iteration is done; it must
    fail naming m2. `wait_s`: how long m2's torchrun gets to end afterwards."""
    cluster = _cluster(tmp_path, machines)
    other = OtherMachine()

    def lose_once_training(line: str) -> None:
        OtherMachine.say(other, line)
        if line.startswith("iteration 1"):
            lose(other)

    try:
        coordinator = _coordinator(tmp_path, cluster, other, "emulated", iterations=200)
        coordinator.say = lose_once_training
        with pytest.raises(RunFailed, match="on machine m2 ") as failed:
            asyncio.run(run_with_signals(coordinator))
        print(failed.value)
    finally:
        other.output(wait_s)
    # as after a crash on a real machine: `testbed down` there removes what it left
    assert _cli("down").returncode == 0
    return coordinator


def test_a_machine_whose_torchrun_is_killed_ends_the_run_naming_it(
        tmp_path: Path, machines: dict[str, str]) -> None:
    def kill(other: OtherMachine) -> None:
        assert other.torchrun is not None
        os.killpg(other.torchrun.pid, signal.SIGKILL)

    coordinator = _lose_m2_in_training(tmp_path, machines, kill, wait_s=30)
    assert coordinator.outcome is not None and coordinator.outcome.status == "failed"
    # well within the stall timeout (60 s): the closed connections name the machine
    assert coordinator.outcome.wall_s < 60


@pytest.mark.benchmark  # a killed torchrun is the suite's lost machine
def test_a_machine_cut_off_the_cluster_network_ends_the_run_naming_it(
        tmp_path: Path, machines: dict[str, str]) -> None:
    def cut(_other: OtherMachine) -> None:
        subprocess.run(["ip", "-n", machines["m2"], "link", "set", "dev", "lan", "down"],
                       check=True)

    # a machine cut off is not waited for
    coordinator = _lose_m2_in_training(tmp_path, machines, cut, wait_s=0)
    assert coordinator.outcome is not None
    # the control connections' liveness bound (about 15 s) ends it before the stall
    # timeout (60 s) would
    assert coordinator.outcome.wall_s < 60


def test_a_network_event_changes_both_directions_of_a_link_across_machines(
        tmp_path: Path, machines: dict[str, str]) -> None:
    """east (m1) -> west (m2) is changed by m1's router, west -> east by m2's: a ping's
    round trip holds both."""
    cluster = _cluster(tmp_path, machines)
    other = OtherMachine()
    rtts: list[float] = []

    def ping_once_changed(line: str) -> None:
        OtherMachine.say(other, line)
        if line.startswith("network event starts"):
            address = coordinator.hosts.address_of("west-0")

            def ping() -> None:
                time.sleep(0.3)  # said before it is applied, here and on m2
                slot = json.loads(cluster.read_text())["slot"]
                rtts.extend(ping_rtts(f"{prefix_for(slot)}east-0", address, count=5,
                                      interval_s=0.2))

            threading.Thread(target=ping, daemon=True).start()

    # at 100 ms each way an iteration takes 0.8 s: four outlast the pings (1.2 s from the
    # event) with room to spare
    coordinator = _coordinator(tmp_path, cluster, other, "emulated",
                               ("at=0s,link=east-west,latency=100ms",), iterations=4)
    coordinator.say = ping_once_changed
    try:
        outcome = asyncio.run(run_with_signals(coordinator))
    finally:
        other.output()
    assert outcome.status == "ok", other.lines
    assert len(rtts) == 5
    # 100 ms each way (20 ms each way before; 120 ms if only m1's direction changed)
    assert min(rtts) >= 0.195, rtts


def test_bubbletea_across_machines_serves_prefills_to_both_decode_servers(
        tmp_path: Path, machines: dict[str, str]) -> None:
    """Each DC's decode server sits on its DC's machine, after its workers (m2: rank 2)."""
    from testbed.experiments.run import run
    from testbed.run.spec import RunSpec

    cluster_path = _cluster(tmp_path, machines)
    other = OtherMachine()
    inputs = load_inputs(TWO_DC, sets=(
        "iterations=4", "inference.model=tiny", "inference.arrival_rate=100",
        "inference.prompt_length.distribution=fixed", "inference.prompt_length.value=16"))
    cluster = load_cluster(cluster_path, inputs.topology)
    across = ClusterRun(cluster, "m1", read_secret(cluster), 120)
    spec = RunSpec.build("emulate", inputs.topology, inputs.job, policy="1f1b",
                         bubble_policy="bubbletea", compute="emulated", cluster=across)
    try:
        results = run(spec, tmp_path / "run", other.say).results
    finally:
        printed = other.output()
    assert results["status"] == "ok", (results["error"], printed[-2000:])
    assert "--nproc-per-node 3" in next(line for line in other.lines if "on m2:" in line)
    assert results["inference"]["served"] > 10
    assert results["cluster"]["machines"][1]["dcs"] == ["west"]


def test_a_machine_that_never_joins_is_named_when_the_join_timeout_ends(
        tmp_path: Path, machines: dict[str, str]) -> None:
    cluster = _cluster(tmp_path, machines)
    silent = OtherMachine()
    silent.say = silent.lines.append  # type: ignore[method-assign]  # m2's user never runs it
    coordinator = _coordinator(tmp_path, cluster, silent, "emulated", join_timeout_s=2,
                               iterations=2)
    # m1's torchrun waits at the rendezvous for m2's: neither machine's processes start
    started = time.monotonic()
    with pytest.raises(RunFailed, match=r"did not all start within 2 s; not joined: "
                                        r"m1 \(2 of 2\), m2 \(2 of 2\) \(torchrun starts"):
        asyncio.run(run_with_signals(coordinator))
    # no order reaches a torchrun at its rendezvous: it is ended, not given the grace
    # that workers told to stop get
    assert time.monotonic() - started < 2 + STOP_GRACE_S
