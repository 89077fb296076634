"""The simulator's clock: callbacks by virtual time, each advancing the run."""

from __future__ import annotations

import gc
import heapq
import itertools
from collections.abc import Callable


class Agenda:
    """Callbacks by time; ties run in the order they were scheduled."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[[float], None]]] = []
        self._seq = itertools.count()
        self.now = 0.0
        self.stop_after = float("inf")
        """Callbacks later than this are not run (a run that has shown enough stops)."""

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
                self.now = time
                callback(time)
                count += 1
        finally:
            if collecting:
                gc.enable()
        return count
