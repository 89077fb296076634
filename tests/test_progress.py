"""Progress of long commands where no terminal shows a bar (a log, CI): a status line as
each run starts and every few seconds; --quiet shows none, --verbose each run's own lines
too; the thread that writes the periodic lines ends with the work, however it ends."""

from __future__ import annotations

import io
import re
import threading
from pathlib import Path

import pytest

from testbed.cli import progress
from testbed.cli.progress import THREAD_NAME, Reporter, clock
from testbed.common.choices import Verbosity

from .conftest import TOPOLOGIES
from .test_cli import call

TWO_DC = TOPOLOGIES / "two-dc.yaml"
STATUS = re.compile(r"^(compare|sweep): (\d+)/(\d+) (runs?|points?) done(, now (\S+))?, "
                    r"(\d+h\d\dm|\d+m\d\ds|\d+s) elapsed$")
EVERY_S = 0.01
"""The status lines' period in these tests: many lines in any run that takes 0.1 s."""


def _threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == THREAD_NAME]


def _status(err: str, command: str) -> list[re.Match[str]]:
    return [m for line in err.splitlines() if (m := STATUS.match(line)) and m[1] == command]


@pytest.fixture
def fast_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """Status lines every EVERY_S, and the plan search's lines at every candidate (a run's
    own lines, for --verbose to show)."""
    import testbed.policy.context as context

    monkeypatch.setattr(progress, "EVERY_S", EVERY_S)
    monkeypatch.setattr(context, "PROGRESS_EVERY_S", 0.0)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _plain(text: str) -> list[str]:
    """The lines, without how long it had taken."""
    return [re.sub(r", \S+ elapsed$", "", line) for line in text.splitlines()]


def test_off_a_terminal_a_line_at_each_start_every_period_and_at_the_end() -> None:
    stream = io.StringIO()
    reporter = Reporter("compare", "normal", stream, every_s=EVERY_S)
    with reporter.counting("simulate: 2 runs", 2, "run") as steps:
        steps.start("a-r1")
        threading.Event().wait(20 * EVERY_S)
        steps.finish("a-r1")
        steps.start("b-r1")
        steps.finish("b-r1")
    text = stream.getvalue()
    lines = _plain(text)
    assert lines[0] == "simulate: 2 runs"
    assert all(STATUS.match(line) for line in text.splitlines()[1:]), text
    first = lines.index("compare: 0/2 runs done, now a-r1")
    # a busy machine may let a period pass before the first run starts: its line, only
    assert all(line == "compare: 0/2 runs done" for line in lines[1:first]), text
    assert lines.count("compare: 0/2 runs done, now a-r1") >= 2  # the period's lines
    assert "compare: 1/2 runs done, now b-r1" in lines
    assert lines[-1] == "compare: 2/2 runs done"
    assert not _threads()


def test_the_periodic_thread_ends_with_the_block_when_the_work_fails() -> None:
    stream = io.StringIO()
    reporter = Reporter("sweep", "normal", stream, every_s=EVERY_S)
    with pytest.raises(KeyboardInterrupt), reporter.counting("points", 3, "point") as steps:
        assert len(_threads()) == 1
        steps.finish("p1")
        raise KeyboardInterrupt
    assert not _threads()
    written = stream.getvalue()
    threading.Event().wait(10 * EVERY_S)
    assert stream.getvalue() == written  # nothing writes after the block


def test_quiet_shows_nothing_but_warnings_and_starts_no_thread() -> None:
    stream = io.StringIO()
    reporter = Reporter("compare", "quiet", stream, every_s=EVERY_S)
    with reporter.counting("simulate: 1 run", 1, "run") as steps:
        assert not _threads()
        steps.start("a")
        reporter.say("planning with atlas: 3 candidate plans simulated, 5 s so far")
        reporter.detail("training: 4 iterations")
        reporter.detail("warning: no prediction for this run: why")
        steps.finish("a")
    assert stream.getvalue() == "  warning: no prediction for this run: why\n"


def test_verbose_adds_the_runs_own_lines_and_each_end() -> None:
    normal, verbose = io.StringIO(), io.StringIO()
    streams: list[tuple[io.StringIO, Verbosity]] = [(normal, "normal"), (verbose, "verbose")]
    for stream, verbosity in streams:
        reporter = Reporter("compare", verbosity, stream)
        with reporter.counting("simulate: 1 run", 1, "run") as steps:
            steps.start("a-r1")
            reporter.detail("planning with atlas: 3 candidate plans simulated, 5 s so far")
            steps.finish("a-r1")
    assert "planning with atlas" not in normal.getvalue()
    assert _plain(verbose.getvalue()) == [
        "simulate: 1 run", "compare: 0/1 run done, now a-r1",
        "  planning with atlas: 3 candidate plans simulated, 5 s so far", "  a-r1: done",
        "compare: 1/1 run done"]
    assert _plain(normal.getvalue()) == [
        "simulate: 1 run", "compare: 0/1 run done, now a-r1", "compare: 1/1 run done"]


def test_on_a_terminal_a_bar_with_the_runs_lines_above_it_and_no_thread() -> None:
    stream = _Terminal()
    reporter = Reporter("compare", "verbose", stream, every_s=EVERY_S)
    with reporter.counting("simulate: 2 runs", 2, "run") as steps:
        assert not _threads()
        steps.start("a-r1")
        reporter.detail("training: 4 iterations")
        steps.finish("a-r1")
    text = stream.getvalue()
    assert "simulate: 2 runs  [" in text and "50%  a-r1" in text
    assert "\r\033[K  training: 4 iterations\n" in text
    assert not STATUS.search(text.replace("\r", "\n"))


def test_clock_reads_at_a_glance() -> None:
    assert [clock(s) for s in (0.4, 45, 130, 3600 + 125)] == ["0s", "45s", "2m10s", "1h02m"]


def test_compare_off_a_terminal_says_how_it_goes(tmp_path: Path, fast_lines: None) -> None:
    """Before: `simulate: 2 runs` and nothing more until the table."""
    args = ["compare", str(TWO_DC), "-p", "1f1b", "-p", "atlas", "--iterations", "2"]
    code, _, err = call([*args, "--out", str(tmp_path / "normal")])
    assert code == 0, err
    lines = _status(err, "compare")
    starts = [m[6] for m in lines if m[6]]
    assert starts[0] == "1f1b-r1" and starts[-1] == "atlas-r1"
    assert len(lines) > 3, err  # beyond the two starts and the end: a line every period
    assert [(m[2], m[3]) for m in lines][-1] == ("2", "2")
    assert "planning with atlas" not in err
    assert not _threads()

    code, _, quiet = call([*args, "--quiet", "--out", str(tmp_path / "quiet")])
    assert code == 0, quiet
    assert quiet == ""

    code, _, verbose = call([*args, "--verbose", "--out", str(tmp_path / "verbose")])
    assert code == 0, verbose
    assert _status(verbose, "compare")
    assert "  1f1b-r1: done" in verbose.splitlines()
    assert any(line.startswith("  planning with atlas: ") for line in verbose.splitlines())
    assert not _threads()


def test_sweep_off_a_terminal_says_how_it_goes(tmp_path: Path, fast_lines: None) -> None:
    args = ["sweep", str(TWO_DC), "-p", "1f1b", "-p", "atlas", "--iterations", "2",
            "--vary", "wan.latency=10ms,40ms", "--workers", "1"]
    code, _, err = call([*args, "--out", str(tmp_path / "normal")])
    assert code == 0, err
    lines = _status(err, "sweep")
    assert len(lines) > 1, err  # a line every period and the end
    assert [(m[2], m[3]) for m in lines][-1] == ("2", "2")
    assert "done" not in err.replace("points done", "")
    assert not _threads()

    code, _, quiet = call([*args, "-q", "--out", str(tmp_path / "quiet")])
    assert code == 0, quiet
    assert quiet == ""

    code, _, verbose = call([*args, "-v", "--out", str(tmp_path / "verbose")])
    assert code == 0, verbose
    assert {"  wan.latency=10ms: done", "  wan.latency=40ms: done"} <= set(verbose.splitlines())
    assert _status(verbose, "sweep")


def test_simulate_quiet_leaves_out_the_runs_progress_lines(tmp_path: Path, fast_lines: None
                                                           ) -> None:
    args = ["simulate", str(TWO_DC), "-p", "atlas", "--iterations", "2"]
    code, out, err = call([*args, "--out", str(tmp_path / "normal")])
    assert code == 0, err
    assert "planning with atlas: " in err
    code, quiet_out, quiet = call([*args, "-q", "--out", str(tmp_path / "quiet")])
    assert code == 0, quiet
    assert quiet == ""
    assert quiet_out.splitlines()[:-1] == out.splitlines()[:-1]  # the same results


def test_planning_forks_its_processes_beside_the_status_thread() -> None:
    """Planning spreads over processes only where no other thread runs (a fork could
    catch one holding a lock): the status thread, written to be forked beside, leaves
    compare's planning as parallel off a terminal as on one."""
    from testbed.policy.parallel import pool_size

    reporter = Reporter("compare", "normal", io.StringIO(), every_s=EVERY_S)
    with reporter.counting("runs", 1, "run"):
        assert _threads() and pool_size(2) == 2
        other = threading.Thread(target=threading.Event().wait, args=(0.2,))
        other.start()
        assert pool_size(2) == 1  # any other thread still keeps planning in this process
        other.join()


def test_a_fork_never_finds_the_status_thread_halfway_through_a_line(tmp_path: Path) -> None:
    """A forked child writes to the stream the status thread writes to, every one of many
    forks made while the thread writes without pause: none finds the stream locked."""
    import os
    import time

    with (tmp_path / "log").open("w") as stream:
        reporter = Reporter("sweep", "normal", stream, every_s=1e-6)
        with reporter.counting("points", 1, "point"):
            for _ in range(100):
                pid = os.fork()
                if pid == 0:  # the child
                    stream.write("child\n")
                    stream.flush()
                    os._exit(0)
                deadline = time.monotonic() + 10
                while (done := os.waitpid(pid, os.WNOHANG))[0] == 0:
                    if time.monotonic() > deadline:
                        os.kill(pid, 9)
                        os.waitpid(pid, 0)
                        pytest.fail("a forked child hung writing to the stream")
                    time.sleep(0.001)
                assert os.waitstatus_to_exitcode(done[1]) == 0
    assert (tmp_path / "log").read_text().count("child\n") == 100


def test_figures_counts_its_claims_and_quiet_leaves_them_out(tmp_path: Path,
                                                             fast_lines: None) -> None:
    args = ["figures", "--conditions", str(TWO_DC), "--claims", "atlas_vs_pipelines",
            "--frontier", "off"]
    code, _, err = call([*args, "--out", str(tmp_path / "normal")])
    assert code == 0, err
    lines = _plain(err)
    assert "figures: 0/1 claim done, now atlas_vs_pipelines on two-dc" in lines
    assert lines[-1] == "figures: 1/1 claim done"
    assert not any(line.startswith("  ") for line in lines)  # the runs' own: --verbose
    code, _, verbose = call([*args, "-v", "--out", str(tmp_path / "verbose")])
    assert code == 0, verbose
    assert any(line.startswith("  planning with atlas: ") for line in verbose.splitlines())
    code, _, quiet = call([*args, "-q", "--out", str(tmp_path / "quiet")])
    assert code == 0, quiet
    assert quiet == ""
