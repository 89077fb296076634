"""What the workers report during training: spans, losses, who finished which iteration,
event-loop lag; the progress lines a user sees, and who a stall is waiting on."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from testbed.common.spans import Span
from testbed.emulator.net.state import process_state
from testbed.emulator.runtime.coordinator.pool import WorkerHandle
from testbed.emulator.runtime.wire.messages import IterationDone


@dataclass
class Telemetry:
    workers: int
    dp: int
    iterations: int
    dilation: int = 1
    start: float = 0.0
    spans: list[Span] = field(default_factory=list)
    losses: dict[int, float] = field(default_factory=dict)
    synced_losses: dict[int, float] = field(default_factory=dict)
    """The synchronized model's loss by iteration, as the run's last worker reports it
    (testbed.emulator.runtime.worker.synced_loss)."""
    iterations_seen: dict[int, set[str]] = field(default_factory=dict)
    lags: list[float] = field(default_factory=list)
    """Each worker's p99 event-loop lag per iteration, the first (warm-up) left out."""
    last_progress: float = 0.0

    def begin(self, now: float) -> None:
        self.start = self.last_progress = now

    def on_iteration(self, gpu: str, report: IterationDone) -> str | None:
        """Record a worker's iteration; the progress line once every worker finished it."""
        iteration = report.iteration
        self.spans.extend(report.spans)
        if iteration > 0:  # the first iteration warms up
            self.lags.append(report.lag_p99_s)
        if report.loss is not None:
            self.losses.setdefault(iteration, 0.0)
            self.losses[iteration] += report.loss / self.dp
        seen = self.iterations_seen.setdefault(iteration, set())
        seen.add(gpu)
        self.last_progress = time.monotonic()
        if len(seen) < self.workers:
            return None
        ends = [s["end"] for s in self.spans
                if s["kind"] == "step" and s["iteration"] == iteration]
        previous = [s["end"] for s in self.spans
                    if s["kind"] == "step" and s["iteration"] == iteration - 1]
        began = max(previous) if previous else self.start
        loss = self.losses.get(iteration)
        return (f"iteration {iteration + 1}/{self.iterations}: "
                f"{(max(ends) - began) / self.dilation:.3f} s"
                + (f", loss {loss:.4f}" if loss else ""))

    def stalled_for(self) -> float:
        return time.monotonic() - self.last_progress

    def stuck(self, workers: Sequence[WorkerHandle], first_iteration: int = 0) -> str:
        """The workers a stall is waiting on: stopped processes first, else those that
        finished the fewest iterations (every worker, when they are level)."""
        stopped = [w for w in workers if w.process is not None
                   and process_state(w.process.pid) in ("T", "t")]
        if stopped:
            return ", ".join(f"{w.describe()} is stopped" for w in stopped)
        done = {w.gpu: sum(w.gpu in seen for seen in self.iterations_seen.values())
                for w in workers if not w.finished}
        if not done:
            return "no worker (all finished)"
        fewest = min(done.values())
        behind = [w.describe() for w in workers if done.get(w.gpu) == fewest]
        where = f"in iteration {first_iteration + fewest + 1}"
        return f"{', '.join(behind[:4])}{' ...' if len(behind) > 4 else ''} ({where})"
