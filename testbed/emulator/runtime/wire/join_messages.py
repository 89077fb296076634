"""Messages of a process joining a run from another machine
(testbed.emulator.runtime.worker.join and testbed.emulator.runtime.coordinator.cluster_run),
in the order they are sent."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.emulator.runtime.wire.messages import Message


@dataclass(frozen=True)
class Challenge(Message):
    """First words on a TCP control connection: prove the cluster's secret on this fresh
    nonce (testbed.emulator.runtime.wire.secret.join_proof)."""

    op = "challenge"
    nonce: str


@dataclass(frozen=True)
class Join(Message):
    """A process torchrun started on `machine`, with its proof of the secret on the
    challenge and its own fresh nonce, which the coordinator's proof must cover."""

    op = "join"
    machine: str
    local_rank: int
    pid: int
    nonce: str
    proof: str


@dataclass(frozen=True)
class ShareOrder:
    """The network share the first process on a machine brings up there and removes when
    it ends: the topology as emulated (dilated, host TCP as planned) and the cluster, as
    JSON of their dumps."""

    topology: str
    cluster: str
    decode_dcs: list[str]
    shaper: str
    seed: int


@dataclass(frozen=True)
class Assign(Message):
    """Who the joining process is to be: a host's worker or decode server, in `netns`;
    `nonce` gives it the run's token (derived from the secret, never sent); `proof` is
    the coordinator's proof of the secret (cluster_secret.coordinator_proof)."""

    op = "assign"
    host: str
    netns: str
    role: str
    address: str
    nonce: str
    proof: str
    share: ShareOrder | None = None


@dataclass(frozen=True)
class ShareUp(Message):
    """The machine's share of the network is up: its other processes may enter it."""

    op = "share_up"
    seconds: float


@dataclass(frozen=True)
class Refused(Message):
    op = "refused"
    reason: str


@dataclass(frozen=True)
class TimeAsk(Message):
    """A joining process measures its clock against the coordinator's."""

    op = "time_ask"


@dataclass(frozen=True)
class TimeIs(Message):
    op = "time_is"
    now: float


@dataclass(frozen=True)
class LinkChange(Message):
    """A network event, to the process that holds a machine's share: change the
    directions of WAN link a-b whose sending router is on that machine."""

    op = "link_change"
    a: str
    b: str
    latency_s: float | None
    bandwidth_bps: float | None
    loss: float | None
    one_way: bool = False
    """Only the direction a->b (a link trace's)."""


@dataclass(frozen=True)
class LaunchEnded(Message):
    """`testbed launch` across machines: this machine's ranks have all ended (its share of
    the network stays up until the coordinator closes the connection: another machine's
    ranks may still be sending through it)."""

    op = "launch_ended"
    status: str
