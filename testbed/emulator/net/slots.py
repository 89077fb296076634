"""Where a new network goes on this machine: a run slot whose names (and addresses) no
other network here holds, or, for a cluster's fixed slot, a refusal naming what is taken."""

from __future__ import annotations

from collections.abc import Callable

from testbed.emulator.net import netns as kernel
from testbed.emulator.net.layout import Layout
from testbed.emulator.net.state import read_states
from testbed.errors import NetworkError
from testbed.topology.limits import MAX_SLOTS


def refuse_taken_names(layout: Layout) -> None:
    """A cluster's slot is fixed (every machine must agree on names and addresses): refuse
    if something here already holds one of its names."""
    states, damaged = read_states()
    recorded = [*states, *(d.salvaged for d in damaged)]  # a damaged file's, as far as it reads
    taken = sorted(set(layout.namespaces()) & (
        set(kernel.list_namespaces()) | {n for s in recorded for n in s.namespaces}))
    if taken:
        raise NetworkError(
            f"namespaces {', '.join(taken[:4])} already exist here (slot {layout.slot}); "
            "`testbed down` removes what killed runs left, or set another `slot:` in the "
            "cluster file")


def free_slot(layout_for: Callable[[int], Layout]) -> int:
    states, damaged = read_states()
    taken = {s.slot for s in states} | {d.salvaged.slot for d in damaged}
    existing = set(kernel.list_namespaces())
    for slot in range(MAX_SLOTS):
        if slot in taken:
            continue
        if existing & set(layout_for(slot).namespaces()):
            continue  # names held by something that is not a run of ours
        return slot
    raise NetworkError(
        f"all {MAX_SLOTS} run slots are in use; `testbed down` removes what killed runs left"
    )
