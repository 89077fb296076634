"""Temporal sharing of a WAN link direction: one transfer at a time, in the order the
training policy's `next_transfer` chooses. Pure, so the emulator and the simulator run
exactly the same arbitration."""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.errors import PluginError
from testbed.plan.model import Plan
from testbed.policy.base import TrainingPolicy, Transfer
from testbed.policy.guard import plugin_code

Link = tuple[str, str]
Lane = tuple[str, str, int]
"""A link direction and a DP-cell: each cell's transfers take turns; cells run side by side."""


@dataclass
class Arbiter:
    policy: TrainingPolicy
    plan: Plan
    waiting: dict[Lane, list[Transfer]] = field(default_factory=dict)
    holder: dict[Lane, Transfer] = field(default_factory=dict)

    def lane(self, transfer: Transfer) -> Lane:
        cell = next((i for i, cell in enumerate(self.plan.dp_cells)
                     if transfer.replica in cell), 0)
        return (transfer.src_dc, transfer.dst_dc, cell)

    def request(self, transfer: Transfer) -> Transfer | None:
        """Queue a transfer; the one granted now (if its lane was free), else None."""
        lane = self.lane(transfer)
        self.waiting.setdefault(lane, []).append(transfer)
        if lane in self.holder:
            return None
        return self._grant(lane)

    def release(self, transfer: Transfer) -> Transfer | None:
        """`transfer` finished; the next one on its lane granted (or None if none waits)."""
        lane = self.lane(transfer)
        if self.holder.get(lane) is transfer:
            del self.holder[lane]
        return self._grant(lane)

    def _grant(self, lane: Lane) -> Transfer | None:
        if lane in self.holder:
            return None
        queue = self.waiting.get(lane)
        if not queue:
            return None
        link = (lane[0], lane[1])
        with plugin_code(f"policy {self.policy.name!r} failed in next_transfer",
                         type(self.policy).__module__):
            chosen = self.policy.next_transfer(self.plan, link, tuple(queue))
        if chosen not in queue:
            raise PluginError(
                f"policy {self.policy.name!r} chose a transfer that is not "
                f"waiting on {link[0]}>{link[1]}"
            )
        queue.remove(chosen)
        self.holder[lane] = chosen
        return chosen
