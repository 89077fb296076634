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
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.common.fields import Fields, integer, number, positive
from testbed.common.fsutil import write_atomic
from testbed.common.jsonio import MAX_RECORD_BYTES, read_json
from testbed.common.spans import Span, read_span
from testbed.errors import InputError

CHECKPOINT_DIR = "checkpoint"
STATE_FILE = "state.json"
FORMAT = 1
"""Version of `state.json` and `run.json`; a newer one is refused, not misread."""


def checkpoint_due(done: int, every: int, total: int, period: int = 1) -> bool:
    """After `done` iterations: is a checkpoint taken? Every `every`, and at the end, but
    only between cycles of `period` iterations (a sync started in one iteration of a
    cycle may end in a later one: mid-cycle, a stage's state is not all it holds)."""
    return every > 0 and done > 0 and done % period == 0 and (done % every == 0
                                                             or done == total)


def iteration_dir(checkpoint: Path, done: int) -> Path:
    return checkpoint / f"it{done}"


def _taken_after(path: Path) -> int | None:
    """The iterations done when the checkpoint in `path` (iteration_dir) was taken; None
    where `path` is not one."""
    name = path.name
    if not (name.startswith("it") and name[2:].isdigit() and path.is_dir()):
        return None
    return int(name[2:])


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
            "losses": {str(k): v if math.isfinite(v) else None  # a diverged model's NaN
                       for k, v in self.losses.items()},
            "spans": self.spans,
            "owner": {"pid": self.owner_pid, "start_ticks": self.owner_ticks},
            "resumed_at": self.resumed_at}, allow_nan=False)


def parse_progress(data: Any, source: str) -> Progress:
    """state.json checked whole, types and ranges, before a resumed run makes anything:
    a damaged file is one InputError naming it and the key, never a failure mid-run."""
    top = Fields(data, source)
    version = top.get("format", integer)
    if version != FORMAT:
        raise top.error("format", f"format {version} is not {FORMAT}")
    completed = top.get("completed", positive(integer))
    losses: dict[int, float] = {}
    saved = top.section("losses", required=True)
    assert saved is not None
    for key in saved.data:
        try:
            iteration = _iteration(key, completed)
        except ValueError as exc:
            raise saved.error(key, str(exc)) from None
        losses[iteration] = saved.get(key, _loss, math.nan)  # null: not a number
    spans: list[Span] = []
    for key, item in top.items("spans", required=True):
        span = read_span(Fields(item, source, key))
        if not 0 <= span["iteration"] < completed:
            raise InputError(f"{span['iteration']} is not an iteration before {completed}",
                             source, f"{key}.iteration")
        spans.append(span)
    owner = top.section("owner", required=True)
    assert owner is not None
    pid = owner.get("pid", positive(integer))
    ticks = owner.get("start_ticks", positive(integer, allow_zero=True))
    owner.done()
    resumed: list[int] = []
    for key, value in top.items("resumed_at", required=True):
        try:
            resumed.append(_iteration(value, completed, first=1))
        except ValueError as exc:
            raise InputError(str(exc), source, key) from None
    top.done()
    return Progress(completed, losses, spans, pid, ticks, resumed)


def _iteration(value: Any, completed: int, first: int = 0) -> int:
    """An iteration number (or a key holding one) from `first` to before `completed`."""
    number = int(value) if isinstance(value, str) and value.isdigit() else integer(value)
    if not first <= number < completed:
        raise ValueError(f"{value!r} is not an iteration from {first} to before {completed}")
    return number


def _loss(value: Any) -> float:
    return value if isinstance(value, float) and math.isnan(value) else number(value)


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
    moved: Path | None = None
    """Where the state to resume from was moved to for another plan (a run replanned
    after a failure: testbed.emulator.runtime.worker.compute.reshard), in place of the
    checkpoint's own."""

    def part_written(self, done: int, gpu: str) -> bool:
        """A worker wrote its part of checkpoint `done`; True when that completes it."""
        parts = self._parts.setdefault(done, set())
        parts.add(gpu)
        return len(parts) == self.workers

    def commit(self, done: int, losses: dict[int, float], spans: list[Span],
               start: float) -> None:
        """Name checkpoint `done` in state.json (atomically), then drop the older ones.
        Only the older: workers do not wait for a commit, so by the time this one is
        written (an fsync on a busy machine), they may be writing the next ones."""
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
            taken = _taken_after(old)
            if taken is not None and taken < done:
                shutil.rmtree(old, ignore_errors=True)

    @property
    def first_iteration(self) -> int:
        return self.prior.completed if self.prior else 0

    def restore_dir(self) -> str | None:
        """Where a resumed run's workers load their state from (None: a fresh run)."""
        if self.moved is not None:
            return str(self.moved)
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
    """The newest complete checkpoint, checked (parse_progress); None before the first."""
    path = checkpoint / STATE_FILE
    if not path.exists():
        return None
    return parse_progress(read_json(path, MAX_RECORD_BYTES), str(path))


def save_stage(save: Any, directory: Path, replica: int, stage: int) -> None:
    """Write one stage's part through `save(path)` into a new file of ours renamed into
    place: never half a file, never through a link (testbed.common.fsutil); an engine with
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
