"""Checkpoints of an emulated run, so that a run that dies can be resumed where it was.

Under RUN_DIR/checkpoint: `run.json` (what decides the run, written before it starts),
`topology.yaml`, `state.json` (the newest complete checkpoint: iterations done, losses,
spans and who owns the run) and `it{K}/r{R}-s{S}.pt` (each stage's model and optimizer
after K iterations, with real compute). A checkpoint is complete once every worker wrote
its part; only then does `state.json` name it and the older ones go. Every iteration
starts from the parameters the previous one left and reads data by its index, so K
saved states are a consistent cut whatever the workers were doing when it was taken.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.fsutil import write_atomic
from testbed.spans import Span

CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "state.json"
FORMAT = 1
"""Version of `state.json` and `run.json`; a newer one is refused, not misread."""


def checkpoint_due(done: int, every: int, total: int) -> bool:
    """After `done` iterations: is a checkpoint taken? Every `every`, and at the end."""
    return every > 0 and done > 0 and (done % every == 0 or done == total)


def iteration_dir(checkpoint: Path, done: int) -> Path:
    return checkpoint / f"it{done}"


def stage_file(directory: Path, replica: int, stage: int) -> Path:
    return directory / f"r{replica}-s{stage}.pt"


@dataclass
class Progress:
    """`state.json`: what a resumed run carries over. Span times are seconds from the
    run's start, on the clock the run kept (dilated when it was)."""

    completed: int
    losses: dict[int, float]
    spans: list[Span]
    owner_pid: int
    owner_ticks: int
    resumed_at: list[int] = field(default_factory=list)
    """The iterations earlier resumptions started from."""

    def as_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "completed": self.completed,
            "losses": {str(k): v for k, v in self.losses.items()}, "spans": self.spans,
            "owner": {"pid": self.owner_pid, "start_ticks": self.owner_ticks},
            "resumed_at": self.resumed_at})

    @classmethod
    def from_json(cls, text: str) -> Progress:
        data = json.loads(text)
        if data.get("format") != FORMAT:
            raise ValueError(f"checkpoint format {data.get('format')!r}, expected {FORMAT}")
        return cls(int(data["completed"]), {int(k): float(v) for k, v in data["losses"].items()},
                   list(data["spans"]), int(data["owner"]["pid"]),
                   int(data["owner"]["start_ticks"]), [int(i) for i in data["resumed_at"]])


@dataclass
class Checkpoints:
    """The coordinator's side: counts each worker's part and commits complete ones."""

    directory: Path
    every: int
    workers: int
    owner_pid: int
    owner_ticks: int
    prior: Progress | None = None
    """What the run resumed from: its losses and spans come first."""
    _parts: dict[int, set[str]] = field(default_factory=dict)
    committed: int = 0

    def part_written(self, done: int, gpu: str) -> bool:
        """A worker wrote its part of checkpoint `done`; True when that completes it."""
        parts = self._parts.setdefault(done, set())
        parts.add(gpu)
        return len(parts) == self.workers

    def commit(self, done: int, losses: dict[int, float], spans: list[Span],
               start: float) -> None:
        """Name checkpoint `done` in state.json (atomically), then drop the older ones."""
        prior = self.prior
        kept = [] if prior is None else list(prior.spans)
        kept += shifted([s for s in spans if int(s.get("iteration", -1)) < done],
                        prior_elapsed(prior) - start)
        merged = {**(prior.losses if prior else {}),
                  **{i: v for i, v in losses.items() if i < done}}
        progress = Progress(done, merged, kept, self.owner_pid, self.owner_ticks,
                            prior.resumed_at if prior else [])
        write_atomic(self.directory / STATE_FILE, progress.as_json(), 0o644)
        self.committed = done
        self._parts.pop(done, None)
        for old in self.directory.glob("it*"):
            if old.is_dir() and old.name != iteration_dir(self.directory, done).name:
                shutil.rmtree(old, ignore_errors=True)


    @property
    def first_iteration(self) -> int:
        return self.prior.completed if self.prior else 0

    def restore_dir(self) -> str | None:
        """Where a resumed run's workers load their state from (None: a fresh run)."""
        return str(iteration_dir(self.directory, self.first_iteration)) if self.prior else None

    def carried_over(self, start: float, losses: dict[int, float]
                     ) -> tuple[float, list[Span], dict[int, float]]:
        """The whole run's start, the carried-over spans on this run's clock, and all
        losses, for a run whose own part started at `start`."""
        if self.prior is None or not start:
            return start, [], dict(losses)
        begun = start - prior_elapsed(self.prior)
        return begun, shifted(self.prior.spans, begun), {**self.prior.losses, **losses}


def shifted(spans: list[Span], by: float) -> list[Span]:
    out: list[Span] = []
    for span in spans:
        moved = span.copy()
        moved["start"], moved["end"] = span["start"] + by, span["end"] + by
        out.append(moved)
    return out


def prior_elapsed(prior: Progress | None) -> float:
    """How long the iterations a resumed run carries over took: its own spans start
    that much after the combined run's start."""
    if prior is None:
        return 0.0
    return max((s["end"] for s in prior.spans if s["kind"] == "step"), default=0.0)


def read_progress(checkpoint: Path) -> Progress | None:
    path = checkpoint / STATE_FILE
    if not path.exists():
        return None
    return Progress.from_json(path.read_text())


def save_stage(save: Any, directory: Path, replica: int, stage: int) -> None:
    """Write one stage's part through `save(path)` into a new file of ours renamed into
    place: never half a file, never through a link (testbed.fsutil); an engine with
    nothing to save leaves no file."""
    directory.mkdir(parents=True, exist_ok=True)
    final = stage_file(directory, replica, stage)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=directory)
    os.fchmod(fd, 0o644)
    os.close(fd)
    try:
        save(tmp)
        if os.path.getsize(tmp):
            os.replace(tmp, final)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
