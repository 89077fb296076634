"""What a launch was asked to do, checked before anything starts."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from testbed.emulator.runtime.launch.ranks import MASTER_PORT, Per
from testbed.errors import InputError
from testbed.scenario.scenario import Scenario
from testbed.topology.cluster import Cluster
from testbed.topology.model import Topology
from testbed.topology.net_events import NetEvent

DEFAULT_GRACE_S = 10.0
STOP_GRACE_S = 3.0
"""How long a rank told to stop (SIGTERM) has before SIGKILL."""
DILATION_REFUSED = (
    "a launched program runs unmodified at this machine's speed; dilating the network K "
    "times (rates / K, latencies x K) with its compute, its timers and its timeouts "
    "undilated is a different experiment: the same program on hardware K times faster "
    "whose timeouts are K times shorter, over the named WAN. The launch runs the network "
    "in real time and says so in results.json's `clock`; `testbed up --dilation` dilates "
    "testbed's own workers, compute included")


@dataclass(frozen=True)
class LaunchSpec:
    topology: Topology
    command: tuple[str, ...]
    hosts: tuple[str, ...]
    """The GPU hosts in rank order."""
    placement: str
    out: Path
    per: Per = "host"
    torchrun: bool = False
    max_restarts: int = 0
    master_port: int = MASTER_PORT
    shaper: str = "auto"
    timeout_s: float | None = None
    grace_s: float = DEFAULT_GRACE_S
    """After a rank fails, how long the others have to end by themselves."""
    events: tuple[NetEvent, ...] = ()
    scenario: Scenario = field(default_factory=Scenario)
    target_loss: float | None = None
    sample_s: float = 0.2
    cluster: Cluster | None = None
    machine: str | None = None
    """With a cluster: this machine, which starts the seats of its own DCs."""
    secret: bytes = b""
    """With a cluster: the cluster file's secret, proven on the coordinator's control port."""
    join_timeout_s: float = 300.0
    """With a cluster: how long the coordinator waits for the other machines."""

    def check(self) -> None:
        """A located InputError for what a launch cannot do."""
        if not self.command:
            raise InputError("give the program after `--`: testbed launch TOPO -- python "
                             "train.py", "COMMAND")
        if self.scenario.stragglers:
            raise InputError("stragglers slow testbed's own workers' compute; a launched "
                             "program's compute is its own (use `testbed up` for them)",
                             self.scenario.source, "stragglers")
        if self.per == "dc" and self.torchrun:
            raise InputError("--per dc starts your own torchrun per DC; --torchrun starts "
                             "one per host: give one of them", "--torchrun")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise InputError(f"must be above 0 seconds, got {self.timeout_s:g}", "--timeout")


def refuse_dilation(value: str) -> None:
    """`--dilation` other than 1: refused, saying why (DILATION_REFUSED)."""
    if value.strip() not in ("1", ""):
        raise InputError(DILATION_REFUSED, "--dilation")
