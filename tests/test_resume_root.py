"""A checkpointed run killed mid-training and resumed ends where an uninterrupted run
ends: the same parameters and losses. Needs root (CI runs as root)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("clean_host")]
ROOT = Path(__file__).resolve().parent.parent
TWO_DC = ROOT / "topologies" / "two-dc.yaml"
ITERATIONS, EVERY = 14, 3
CLI = [sys.executable, "-c", "from testbed.cli.main import main; main()"]


def _testbed(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=ROOT, timeout=300)


def _up_args(out: Path, compute: str) -> list[str]:
    return ["up", str(TWO_DC), "--compute", compute, "--iterations", str(ITERATIONS),
            "--checkpoint-every", str(EVERY), "--out", str(out)]


def _completed(run: Path) -> int:
    state = run / "checkpoint" / "state.json"
    try:
        return int(json.loads(state.read_text())["completed"])
    except (OSError, ValueError, KeyError):
        return 0


def _kill_after_first_checkpoint(out: Path, compute: str) -> int:
    proc = subprocess.Popen([*CLI, *_up_args(out, compute)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=ROOT)
    deadline = time.monotonic() + 120
    while _completed(out) < EVERY and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)  # the coordinator dies without tearing anything down
    proc.wait()
    done = _completed(out)
    assert EVERY <= done < ITERATIONS, f"killed after {done} iterations"
    down = _testbed("down")
    assert down.returncode == 0, down.stderr
    return done


@pytest.mark.parametrize("compute", [pytest.param("real", marks=pytest.mark.benchmark),
                                     "emulated"])
def test_a_killed_run_resumes_to_the_same_end(tmp_path: Path, compute: str) -> None:
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    assert _testbed(*_up_args(whole, compute)).returncode == 0
    done = _kill_after_first_checkpoint(resumed, compute)
    first = subprocess.Popen([*CLI, "up", "--resume", str(resumed)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert first.stderr is not None
    said = first.stderr.readline()
    assert f"resuming {resumed} after iteration {done} of {ITERATIONS}" in said
    second = _testbed("up", "--resume", str(resumed))  # while the first one runs
    assert second.returncode == 2 and "in use by another testbed process" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    _, rest = first.communicate(timeout=300)
    assert first.returncode == 0, said + rest
    a = json.loads((whole / "results.json").read_text())
    b = json.loads((resumed / "results.json").read_text())
    assert b["status"] == "ok" and b["iterations"] == ITERATIONS
    assert b["resumed_at"] == [done] and b["checkpoint_every"] == EVERY
    assert b["loss"] == a["loss"]  # real: the same numbers; emulated: none on both
    spans = json.loads((resumed / "spans.json").read_text())["spans"]
    steps = {s["iteration"] for s in spans if s["kind"] == "step"}
    assert steps == set(range(ITERATIONS))  # the carried-over iterations are in the trace
    if compute == "real":
        assert len(a["loss"]) == ITERATIONS
        final = f"it{ITERATIONS}"
        parts = sorted(p.name for p in (whole / "checkpoint" / final).iterdir())
        assert parts == ["r0-s0.pt", "r0-s1.pt", "r1-s0.pt", "r1-s1.pt"]
        for name in parts:
            x = torch.load(whole / "checkpoint" / final / name)
            y = torch.load(resumed / "checkpoint" / final / name)
            for key, value in x["model"].items():
                assert torch.equal(value, y["model"][key]), f"{name}: {key}"
    again = _testbed("up", "--resume", str(resumed))
    assert again.returncode == 2 and "already finished" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1


def test_resume_refuses_what_it_cannot_do(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = _testbed("up", "--resume", str(empty))
    assert result.returncode == 2 and "no checkpointed run" in result.stderr
    result = _testbed("up", str(TWO_DC), "--resume", str(empty))
    assert result.returncode == 2 and "TOPOLOGY.yaml cannot be given" in result.stderr
    result = _testbed("up", "--resume", str(empty), "--iterations", "3")
    assert result.returncode == 2 and "--iterations cannot be given" in result.stderr
    result = _testbed("up", str(TWO_DC), "--checkpoint-every", "2", "--out", str(tmp_path / "x"),
                      "--event", "at=1s,link=east-west,down=1s")
    assert result.returncode == 2 and "network events is not supported" in result.stderr
    assert not (tmp_path / "x").exists()


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpointed run that went to its end, for copies to damage."""
    run = tmp_path_factory.mktemp("finished") / "run"
    assert _testbed(*_up_args(run, "emulated")).returncode == 0
    return run


@pytest.mark.parametrize(("damage", "expected"), [
    ("span-end", "state.json: spans[0].end: missing value"),
    ("completed", "state.json: completed: must be positive, got -3"),
    ("pacing", "run.json: pacing: missing value"),
    ("dilation", "run.json: dilation: must be from 1 to 64, got -4"),
])
def test_damaged_saved_state_is_refused_before_anything_is_made(
        tmp_path: Path, finished: Path, damage: str, expected: str) -> None:
    import shutil

    from testbed.emulator.net.netns import list_namespaces
    from testbed.emulator.net.state import all_states

    run = tmp_path / "run"
    shutil.copytree(finished, run)
    namespaces = set(list_namespaces())
    folder = run / "checkpoint"
    state, settings = (json.loads((folder / name).read_text())
                       for name in ("state.json", "run.json"))
    state["completed"] = 3  # as if killed after the first checkpoint
    state["spans"] = [s for s in state["spans"] if s["iteration"] < 3]
    state["losses"] = {}
    if damage == "span-end":
        del state["spans"][0]["end"]
    elif damage == "completed":
        state["completed"] = -3
    elif damage == "pacing":
        del settings["pacing"]
    else:
        settings["dilation"] = -4
    (folder / "state.json").write_text(json.dumps(state))
    (folder / "run.json").write_text(json.dumps(settings))
    before = (run / "results.json").read_text()
    result = _testbed("up", "--resume", str(run))
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [f"testbed: error: {folder}/{expected}"]
    assert set(list_namespaces()) == namespaces and not all_states()
    assert (run / "results.json").read_text() == before


@pytest.mark.benchmark  # damaged saved state is refused by name in the test above
def test_a_damaged_stage_checkpoint_is_named(tmp_path: Path) -> None:
    run = tmp_path / "run"
    done = _kill_after_first_checkpoint(run, "real")
    part = run / "checkpoint" / f"it{done}" / "r0-s0.pt"
    part.write_bytes(b"not a checkpoint")
    result = _testbed("up", "--resume", str(run))
    assert result.returncode == 1, result.stderr
    error = [line for line in result.stderr.splitlines() if "error" in line]
    assert len(error) == 1 and f"cannot resume from {part}: UnpicklingError" in error[0], \
        result.stderr
