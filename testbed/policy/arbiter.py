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
    waiting: dict[Lane, dict[int, Transfer]] = field(default_factory=dict)
    """Each lane's waiting transfers in the order they came, by id(): a grant finds and
    takes its choice at once, where hundreds wait on a lane at scale."""
    holder: dict[Lane, Transfer] = field(default_factory=dict)
    _cells: dict[int, int] = field(init=False, repr=False)
    """Each replica's DP-cell (its first, where cells overlap)."""
    _guard: plugin_code = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._guard = plugin_code(f"policy {self.policy.name!r} failed in next_transfer",
                                  type(self.policy).__module__)
        self._cells = {}
        for i, cell in enumerate(self.plan.dp_cells):
            for replica in cell:
                self._cells.setdefault(replica, i)

    def lane(self, transfer: Transfer) -> Lane:
        return (transfer.src_dc, transfer.dst_dc, self._cells.get(transfer.replica, 0))

    def request(self, transfer: Transfer) -> Transfer | None:
        """Queue a transfer; the one granted now (if its lane was free), else None."""
        lane = self.lane(transfer)
        self.waiting.setdefault(lane, {})[id(transfer)] = transfer
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
        with self._guard:
            chosen = self.policy.next_transfer(self.plan, link, tuple(queue.values()))
        found = queue.get(id(chosen))
        if found is not chosen:  # one equal to a waiting transfer stands for it, or none
            found = next((t for t in queue.values() if t == chosen), None)
            if found is None:
                raise PluginError(
                    f"policy {self.policy.name!r} chose a transfer that is not "
                    f"waiting on {link[0]}>{link[1]}"
                )
        del queue[id(found)]
        self.holder[lane] = found
        return found
