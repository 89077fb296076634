"""Temporal sharing of a WAN link direction: one transfer at a time, in the order the
training policy's `next_transfer` chooses. Pure, so the emulator and the simulator run
exactly the same arbitration."""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.errors import PluginError, TestbedError
from testbed.plan.model import Plan
from testbed.policy.base import TrainingPolicy, Transfer

Link = tuple[str, str]


@dataclass
class Arbiter:
    policy: TrainingPolicy
    plan: Plan
    waiting: dict[Link, list[Transfer]] = field(default_factory=dict)
    holder: dict[Link, Transfer] = field(default_factory=dict)

    def request(self, transfer: Transfer) -> Transfer | None:
        """Queue a transfer; the one granted now (if the link was free), else None."""
        link = (transfer.src_dc, transfer.dst_dc)
        self.waiting.setdefault(link, []).append(transfer)
        if link in self.holder:
            return None
        return self._grant(link)

    def release(self, link: Link) -> Transfer | None:
        """The holder finished; the next one granted (or None if nobody waits)."""
        self.holder.pop(link, None)
        return self._grant(link)

    def _grant(self, link: Link) -> Transfer | None:
        queue = self.waiting.get(link)
        if not queue:
            return None
        try:
            chosen = self.policy.next_transfer(self.plan, link, tuple(queue))
        except TestbedError:
            raise
        except Exception as exc:
            raise PluginError(
                f"policy {self.policy.name!r} failed in next_transfer: {type(exc).__name__}: {exc}"
            ) from None
        if chosen not in queue:
            raise PluginError(
                f"policy {self.policy.name!r} chose a transfer that is not "
                f"waiting on {link[0]}>{link[1]}"
            )
        queue.remove(chosen)
        self.holder[link] = chosen
        return chosen
