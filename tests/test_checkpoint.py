"""Checkpoint bookkeeping: when one is due, when it is complete, what it carries over, and
what resuming refuses."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from testbed.errors import InputError
from testbed.net.state import process_start_ticks
from testbed.resume import load_resumption
from testbed.runtime.checkpoint import (
    Checkpoints,
    Progress,
    checkpoint_due,
    iteration_dir,
    prior_elapsed,
    read_progress,
)


def test_a_checkpoint_is_due_every_n_and_at_the_end() -> None:
    due = [done for done in range(11) if checkpoint_due(done, 3, 10)]
    assert due == [3, 6, 9, 10]
    assert not any(checkpoint_due(done, 0, 10) for done in range(11))


def _span(gpu: str, iteration: int, start: float, end: float, kind: str = "step") -> dict[
        str, object]:
    return {"gpu": gpu, "kind": kind, "iteration": iteration, "start": start, "end": end}


def test_only_a_checkpoint_every_worker_wrote_is_committed(tmp_path: Path) -> None:
    checkpoints = Checkpoints(tmp_path, 2, 2, 1, 1)
    iteration_dir(tmp_path, 2).mkdir()
    assert not checkpoints.part_written(2, "a")
    assert not checkpoints.part_written(2, "a")  # the same worker twice is still one part
    assert read_progress(tmp_path) is None
    assert checkpoints.part_written(2, "b")
    spans = [_span("a", i, 100 + i, 100.5 + i) for i in range(3)]
    checkpoints.commit(2, {0: 5.0, 1: 4.0, 2: 3.0}, spans, start=100.0)
    progress = read_progress(tmp_path)
    assert progress is not None and progress.completed == 2
    assert progress.losses == {0: 5.0, 1: 4.0}  # iteration 2 is not in the checkpoint
    assert [(s["start"], s["end"]) for s in progress.spans] == [(0.0, 0.5), (1.0, 1.5)]
    iteration_dir(tmp_path, 4).mkdir()
    checkpoints.commit(4, {}, [], start=100.0)
    assert [p.name for p in tmp_path.glob("it*")] == ["it4"]  # the older one is gone


def test_a_resumed_run_carries_the_earlier_iterations_first(tmp_path: Path) -> None:
    prior = Progress(2, {0: 5.0, 1: 4.0}, [_span("a", 0, 0, 1), _span("a", 1, 1, 2.5)], 1, 1,
                     [2])
    assert prior_elapsed(prior) == 2.5
    checkpoints = Checkpoints(tmp_path, 2, 1, 1, 1, prior)
    checkpoints.commit(4, {2: 3.0, 3: 2.0}, [_span("a", 2, 50, 51), _span("a", 3, 51, 52)], 50)
    progress = read_progress(tmp_path)
    assert progress is not None
    assert progress.losses == {0: 5.0, 1: 4.0, 2: 3.0, 3: 2.0}
    assert [s["end"] for s in progress.spans] == [1, 2.5, 3.5, 4.5]
    assert progress.resumed_at == [2]


def _run_dir(tmp_path: Path, progress: Progress, settings_format: int = 1) -> Path:
    folder = tmp_path / "checkpoint"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"format": settings_format}))
    (folder / "state.json").write_text(progress.as_json())
    return tmp_path


def test_resuming_refuses_a_live_run_and_an_unknown_format(tmp_path: Path) -> None:
    pid = os.getpid()
    live = Progress(2, {}, [], pid, process_start_ticks(pid) or 0)
    with pytest.raises(InputError, match="still going"):
        load_resumption(_run_dir(tmp_path / "live", live))
    with pytest.raises(InputError, match=r"run\.json: format: format 9 is not 1"):
        load_resumption(_run_dir(tmp_path / "future", live, settings_format=9))
    with pytest.raises(InputError, match="no checkpointed run"):
        load_resumption(tmp_path)
    broken = tmp_path / "broken" / "checkpoint"
    broken.mkdir(parents=True)
    (broken / "run.json").write_text("{")
    with pytest.raises(InputError, match="unreadable checkpoint"):
        load_resumption(broken.parent)
