"""The plan's WAN arbitration over the control channel: workers ask for a link direction,
the shared Arbiter (the same one the simulator uses) decides, the winner is told."""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.emulator.runtime.coordinator.pool import WorkerHandle
from testbed.emulator.runtime.wire.arbitration import TransferRequest
from testbed.plan.collective import Collective
from testbed.plan.model import Op, Plan
from testbed.policy.arbiter import Arbiter
from testbed.policy.base import TrainingPolicy, Transfer

Granted = tuple[WorkerHandle, str]
"""Who may send now, and the tag of the transfer it may send."""


@dataclass
class ArbiterBridge:
    policy: TrainingPolicy
    plan: Plan
    start: float
    """The run's clock: transfers' times are seconds from here, as in the simulator."""
    _arbiter: Arbiter = field(init=False)
    _pending: dict[str, tuple[Transfer, WorkerHandle]] = field(default_factory=dict)
    _tags: dict[int, str] = field(default_factory=dict)
    _ids: int = 0

    def __post_init__(self) -> None:
        self._arbiter = Arbiter(self.policy, self.plan)

    def request(self, worker: WorkerHandle, ask: TransferRequest) -> Granted | None:
        src_dc, dst_dc = ask.link.split(">")
        self._ids += 1
        transfer = Transfer(
            id=self._ids, src_gpu=ask.src, dst_gpu=ask.dst, src_dc=src_dc, dst_dc=dst_dc,
            kind=Op(ask.kind) if ask.kind in Op.__members__ else Op.SEND_F,
            replica=ask.replica, stage=ask.stage, microbatch=ask.microbatch,
            nbytes=ask.nbytes, ready_at=ask.ready_at - self.start, iteration=ask.iteration,
            collective=Collective.parse(ask.collective) if ask.collective else None)
        self._pending[ask.tag] = (transfer, worker)
        self._tags[transfer.id] = ask.tag
        return self._granted(self._arbiter.request(transfer))

    def sent(self, tag: str) -> Granted | None:
        """A granted transfer's last byte left: the next one on its link, if any."""
        entry = self._pending.pop(tag, None)
        if entry is None:
            return None
        transfer, _ = entry
        self._tags.pop(transfer.id, None)
        return self._granted(self._arbiter.release(transfer))

    def _granted(self, transfer: Transfer | None) -> Granted | None:
        if transfer is None:
            return None
        tag = self._tags[transfer.id]
        return self._pending[tag][1], tag
