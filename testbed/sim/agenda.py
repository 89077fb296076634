"""The simulator's clock: callbacks by virtual time, each advancing the run."""

from __future__ import annotations

import gc
import heapq
import itertools
from collections.abc import Callable

from testbed.common.sizes import MAX_RUN_S

YEAR_S = 365.25 * 86400


class Agenda:
    """Callbacks by time; ties run in the order they were scheduled."""

    def __init__(self, busy: Callable[[], bool] = lambda: True) -> None:
        """`busy`: whether the run still has work, asked once, when the clock first
        passes MAX_RUN_S: a run still going then is an error (a clock that far out no
        longer moves by a round trip, and would never end), while a finished one only
        has late callbacks left (a link coming back after the run)."""
        self._heap: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = itertools.count()
        self.now = 0.0
        self.stop_after = float("inf")
        """Callbacks later than this are not run (a run that has shown enough stops)."""
        self.horizon = MAX_RUN_S
        self._busy = busy

    def at(self, time: float, callback: Callable[[float], None]) -> None:
        now = self.now
        heapq.heappush(self._heap, (time if time > now else now, next(self._seq), callback))

    def run(self) -> int:
        """Run every callback in time order until none is left or the next is later than
        `stop_after` (`now` is then that next one's time); the number run. The cyclic
        garbage collector is off meanwhile: a large run allocates millions of spans and
        events that live to its end, each full collection would scan them all again (a
        quarter to half the wall time at 32,768 GPUs); what cycles a run makes wait for
        its end."""
        count = 0
        heap = self._heap
        collecting = gc.isenabled()
        gc.disable()
        try:
            while heap:
                if heap[0][0] > self.stop_after:
                    self.now = heap[0][0]
                    break
                time, _, callback = heapq.heappop(heap)
                if time > self.horizon:
                    self._past_horizon()
                self.now = time
                callback(time)
                count += 1
        finally:
            if collecting:
                gc.enable()
        return count

    def _past_horizon(self) -> None:
        if self._busy():
            raise RuntimeError(
                f"the run was still going after {self.horizon:.3g} s of simulated time "
                f"({self.horizon / YEAR_S:,.0f} years), the longest a run may last")
        self.horizon = float("inf")
