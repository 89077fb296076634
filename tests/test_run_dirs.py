"""Results directories belong to one process at a time: generated names never collide,
and a directory another process writes into is refused."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.report import results

ROOT = Path(__file__).resolve().parent.parent
TWO_DC = str(ROOT / "topologies" / "two-dc.yaml")


def _pick(base: str, start: float, out: multiprocessing.Queue[str]) -> None:
    time.sleep(max(0.0, start - time.time()))
    out.put(str(results.new_run_dir("two-dc", "gpipe", Path(base))))


def test_runs_started_in_the_same_second_get_directories_of_their_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results.time, "strftime", lambda _f: "20240101-000000")
    chosen = [results.new_run_dir("two-dc", "gpipe", tmp_path) for _ in range(3)]
    context = multiprocessing.get_context("fork")  # the children keep the fixed time
    queue: multiprocessing.Queue[str] = context.Queue()
    start = time.time() + 0.5
    children = [context.Process(target=_pick, args=(str(tmp_path), start, queue))
                for _ in range(6)]
    for child in children:
        child.start()
    chosen += [Path(queue.get(timeout=60)) for _ in children]
    for child in children:
        child.join(timeout=60)
    assert len(set(chosen)) == 9
    assert all(path.is_dir() and not any(path.iterdir()) for path in chosen)
    assert chosen[0].name == "20240101-000000-two-dc-gpipe"


@pytest.fixture
def held(tmp_path: Path) -> Iterator[Path]:
    """A directory another process holds (as a run writing there does)."""
    directory = tmp_path / "held"
    directory.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from testbed.report.run_dirs import claim; claim(Path(sys.argv[1]), None); "
         "print('held', flush=True); time.sleep(120)", str(directory)],
        stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield directory
    finally:
        holder.kill()
        holder.wait()


def _call(args: list[str]) -> tuple[int, str]:
    from click.testing import CliRunner

    with CliRunner().isolation() as (_, err, _):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, err.getvalue().decode()


@pytest.mark.parametrize("force", [False, True])
def test_out_held_by_another_process_is_refused(held: Path, force: bool) -> None:
    code, err = _call(["simulate", TWO_DC, "-p", "gpipe", "--out", str(held),
                       *(["--force"] if force else [])])
    assert code == 2, err
    assert err.strip().splitlines() == [
        f"testbed: error: --out: {held} is in use by another testbed process (a run still "
        "writing there); wait for it or stop it"]
    assert not any(held.iterdir())


def test_a_new_out_refused_later_is_not_left_behind(tmp_path: Path) -> None:
    out = tmp_path / "new" / "run"
    code, err = _call(["simulate", TWO_DC, "-p", "no-such-policy", "--out", str(out)])
    assert code != 0 and not out.exists(), err
    code, err = _call(["simulate", TWO_DC, "-p", "gpipe", "--out", str(out)])
    assert code == 0 and (out / "results.json").is_file(), err


def test_resume_of_a_run_another_process_holds_is_refused(held: Path) -> None:
    """Two `up --resume` at once: the second finds the run taken, before it reads it."""
    import os

    if os.geteuid() != 0:
        pytest.skip("`up` needs root")
    code, err = _call(["up", "--resume", str(held)])
    assert code == 2, err
    assert err.strip().splitlines() == [
        f"testbed: error: --resume: {held} is in use by another testbed process (a run "
        "still writing there); wait for it or stop it"]
