"""The collector kept off old objects during heavy work, and put back as it was."""

from __future__ import annotations

import gc

import pytest

from testbed.common.heap import old_objects_frozen

# the collector's frozen count is the process's: no other thread may free objects meanwhile
pytestmark = pytest.mark.serial


def test_old_objects_are_left_alone_inside_and_tracked_again_after() -> None:
    assert gc.get_freeze_count() == 0
    old = [object() for _ in range(10)]
    with old_objects_frozen():
        frozen = gc.get_freeze_count()
        assert frozen > len(old)
        with old_objects_frozen():  # nested: changes nothing
            assert gc.get_freeze_count() == frozen
        assert gc.get_freeze_count() == frozen
        cycle: list[object] = []
        cycle.append(cycle)  # made inside: collected as usual
        del cycle
        assert gc.collect() >= 1
    assert gc.get_freeze_count() == 0


def test_objects_the_caller_froze_stay_frozen() -> None:
    gc.freeze()
    try:
        count = gc.get_freeze_count()
        with old_objects_frozen():
            pass
        assert gc.get_freeze_count() == count
    finally:
        gc.unfreeze()
