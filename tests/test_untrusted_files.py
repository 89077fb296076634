"""Files testbed is told to write and files it reads back, as a careless or hostile user
leaves them: an output the user names that is a device, a pipe or a link to this
process's stdout stays what it is; an output directory's links are never followed; every
file read back is bounded in size and depth (one line naming it, never a traceback or a
MemoryError); and nothing read from a file reaches the terminal as control sequences, or
quotes a file a scenario names."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.common.input_files import MAX_NESTING
from testbed.common.jsonio import MAX_JSON_BYTES
from testbed.emulator.resume import load_resumption
from testbed.errors import InputError
from testbed.experiments.sweep import Point
from testbed.experiments.sweep_store import POINTS_FILE, SWEEP_FILE, _line, start
from testbed.plan.text import parse_plan_csv
from tests.test_checkpoint import _saved
from tests.test_cli import call

ROOT = Path(__file__).resolve().parent.parent
TWO_DC = ROOT / "topologies" / "two-dc.yaml"
PLAN = ["plan", str(TWO_DC), "-p", "gpipe"]
DEEP = "[" * 100_000 + "]" * 100_000
"""Deep enough that the standard library's JSON reader recurses out."""
NESTED = f"nested deeper than {MAX_NESTING} levels of lists and mappings"
needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="mknod of a character or block device needs root")


def _plan_csv(tmp_path: Path) -> str:
    plain = tmp_path / "plain.csv"
    code, _, err = call([*PLAN, "--csv", str(plain)])
    assert code == 0, err
    return plain.read_text()


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    code, _, err = call(["simulate", str(TWO_DC), "-p", "gpipe", "--iterations", "3",
                         "--out", str(run)])
    assert code == 0, err
    return run


def _one_line(code: int, err: str) -> str:
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err.removeprefix("testbed: error: ").rstrip("\n")


# Outputs the user names: a pipe, a device, this process's stdout are written into.

def test_a_named_pipe_takes_the_output_and_stays_a_pipe(tmp_path: Path) -> None:
    expected = _plan_csv(tmp_path)
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader waits on the other end
    try:
        code, out, err = call([*PLAN, "--csv", str(fifo)])
        written = os.read(reader, 1 << 20)
    finally:
        os.close(reader)
    assert code == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert written.decode() == expected
    assert f"plan written to {fifo}" in out


@pytest.mark.parametrize("stdout", ["pipe", "file"])
def test_a_link_to_this_process_stdout_takes_the_output_in_order_and_stays_a_link(
        tmp_path: Path, stdout: str) -> None:
    """`--csv /dev/stdout` (here a copy of the link: /proc/self/fd/1), whether stdout is a
    pipe or a file the shell opened (`> out.txt`): the CSV goes out after the grid,
    before the line that says where it went, and the link stays."""
    expected = _plan_csv(tmp_path)
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    argv = [sys.executable, "-c", "import sys; from testbed.cli.main import main; "
            "main(sys.argv[1:])", *PLAN, "--csv", str(link)]
    captured = tmp_path / "out.txt"
    with open(captured, "w") as into:
        done = subprocess.run(argv, stdout=subprocess.PIPE if stdout == "pipe" else into,
                              stderr=subprocess.PIPE, text=True, timeout=300, check=False)
    out = done.stdout if stdout == "pipe" else captured.read_text()
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"
    assert out.count(expected) == 1
    assert out.index("policy gpipe:") < out.index(expected) < out.index(f"plan written to {link}")


def test_a_socket_named_as_an_output_is_refused_and_stays(tmp_path: Path) -> None:
    path = tmp_path / "s"
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(path))
        code, _, err = call([*PLAN, "--csv", str(path)])
    assert _one_line(code, err) == (f"--csv: {path} is a socket; give a file, a pipe or a "
                                    "character device such as /dev/null")
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


@needs_root
def test_a_device_named_as_an_output_stays_a_device(tmp_path: Path) -> None:
    """A copy of /dev/null (never the machine's own) takes `plan --csv` and `profile -o`
    and is still the device after; a block device is refused before it is opened."""
    null = tmp_path / "null"
    os.mknod(null, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    code, _, err = call([*PLAN, "--csv", str(null)])
    assert code == 0, err
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    run = _run(tmp_path)
    code, out, err = call(["profile", str(run), "-o", str(null)])
    assert code == 0, err
    assert stat.S_ISCHR(os.lstat(null).st_mode) and not (run / "profile.json").exists()
    assert f"profile written to {null}" in out
    disk = tmp_path / "disk"
    os.mknod(disk, stat.S_IFBLK | 0o600, os.makedev(7, 250))
    code, _, err = call([*PLAN, "--csv", str(disk)])
    assert _one_line(code, err) == (f"--csv: {disk} is a block device (a disk?); give a "
                                    "file, a pipe or a character device such as /dev/null")
    assert stat.S_ISBLK(os.lstat(disk).st_mode)


# An output directory's links are never followed.

def test_compare_force_replaces_a_runs_link_in_out_and_writes_nothing_through_it(
        tmp_path: Path) -> None:
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "runs").symlink_to(elsewhere)
    code, _, err = call(["compare", str(TWO_DC), "-p", "gpipe", "--out", str(out), "--force"])
    assert code == 0, err
    assert list(elsewhere.iterdir()) == []
    assert not (out / "runs").is_symlink()
    assert (out / "runs" / "gpipe-r1" / "results.json").is_file()


# Files read back: bounded in size and kind.

def test_results_validate_refuses_a_device_and_a_huge_file_before_reading(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.json").symlink_to("/dev/zero")
    code, _, err = call(["results", "validate", str(run)])
    assert _one_line(code, err) == \
        f"{run / 'results.json'}: is not a regular file (a device or socket?)"
    big = tmp_path / "big.json"
    with open(big, "wb") as sparse:
        sparse.truncate(MAX_JSON_BYTES + 1)
    code, _, err = call(["results", "validate", str(big)])
    assert _one_line(code, err) == f"{big}: larger than 64 MiB: not an input file of testbed"


def test_resume_refuses_a_state_file_that_is_a_device(tmp_path: Path) -> None:
    run = _saved(tmp_path)
    state = run / "checkpoint" / "state.json"
    state.unlink()
    state.symlink_to("/dev/zero")
    with pytest.raises(InputError) as caught:
        load_resumption(run)
    assert str(caught.value) == f"{state}: is not a regular file (a device or socket?)"


def test_report_refuses_a_comparison_file_that_is_a_device(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "compare.json").symlink_to("/dev/zero")
    code, _, err = call(["report", str(out)])
    assert _one_line(code, err) == \
        f"{out / 'compare.json'}: is not a regular file (a device or socket?)"


# Files read back: bounded in depth.

def test_a_deeply_nested_yaml_file_or_set_value_is_one_line(tmp_path: Path) -> None:
    """822 bytes of `[` ended in a RecursionError; an alias standing for a deep anchor
    deep inside counts as deep as it stands for."""
    path = tmp_path / "deep.yaml"
    path.write_text("name: " + "[" * 408 + "]" * 408 + "\n")
    code, _, err = call(["validate", str(path)])
    assert _one_line(code, err) == f"{path}: line 1: YAML error: {NESTED}"
    half = "[" * 40 + "{}" + "]" * 40
    path.write_text(f"a: &a {half}\nb: " + "[" * 40 + "*a" + "]" * 40 + "\n")
    code, _, err = call(["validate", str(path)])
    assert _one_line(code, err) == f"{path}: line 2: YAML error: {NESTED}"
    code, _, err = call(["validate", str(TWO_DC), "--set", "model.layers=" + DEEP[:800]
                         + DEEP[-800:]])
    assert _one_line(code, err) == f"--set: line 1: YAML error: {NESTED}"


@pytest.mark.parametrize("deep", [DEEP, "[" * 200 + "]" * 200])
def test_deeply_nested_results_spans_and_comparisons_are_one_line(
        tmp_path: Path, deep: str) -> None:
    """Past what orjson reads (1,024 levels), and within it but past what any code that
    walks the value may recurse through."""
    run = _run(tmp_path)
    results = json.loads((run / "results.json").read_text())
    (run / "results.json").write_text(json.dumps(results)[:-1] + f', "extra": {deep}}}')
    code, _, err = call(["results", "validate", str(run)])
    assert _one_line(code, err).startswith(f"{run / 'results.json'}: ")
    assert err.endswith(f"{NESTED}\n")
    spans = (run / "spans.json").read_text()
    (run / "spans.json").write_text(spans[:-1] + f', "extra": {deep}}}')
    code, _, err = call(["profile", str(run)])
    assert err.endswith(f"{NESTED}\n") and str(run / "spans.json") in _one_line(code, err)
    (tmp_path / "compare.json").write_text(f'{{"runs": {deep}}}')
    code, _, err = call(["report", str(tmp_path)])
    key = "runs: " if deep != DEEP else ""  # where orjson reads it, the key is known
    assert _one_line(code, err) == f"{tmp_path / 'compare.json'}: {key}{NESTED}"


def test_a_deeply_nested_checkpoint_is_one_line(tmp_path: Path) -> None:
    run = _saved(tmp_path, raw_state=f'{{"completed": 3, "spans": {DEEP}}}')
    with pytest.raises(InputError) as caught:
        load_resumption(run)
    assert str(caught.value).endswith(NESTED)
    assert str(caught.value).startswith(f"{run / 'checkpoint' / 'state.json'}: ")


def test_a_deeply_nested_run_state_file_is_damaged_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`testbed down` and `net ls` list run state files: a deep one is damaged, skipped."""
    from testbed.emulator.net import state

    monkeypatch.setattr(state, "STATE_DIR", tmp_path)
    (tmp_path / "deep.json").write_text(DEEP)
    assert state.all_states() == []
    assert state.damaged_state_files() == [tmp_path / "deep.json"]


def test_a_deeply_nested_sweep_file_or_point_is_refused_or_left_out(tmp_path: Path) -> None:
    point = Point(0, (("microbatches", "4"),), ())
    sweep = start(tmp_path, {"a": 1}, [point], force=False)
    assert sweep.done == {}
    (tmp_path / POINTS_FILE).write_text(DEEP + "\n" + _line(point, [], sweep.fingerprint))
    resumed = start(tmp_path, {"a": 1}, [point], force=False)
    assert resumed.done == {0: []}
    assert len(resumed.notes) == 1  # the deep line, left out
    (tmp_path / SWEEP_FILE).write_text(DEEP)
    with pytest.raises(InputError) as caught:
        start(tmp_path, {"a": 1}, [point], force=False)
    assert "is not a sweep this testbed wrote" in str(caught.value)


@pytest.mark.parametrize("depth", [60_000, 100])
def test_a_deeply_nested_plan_note_is_one_line(tmp_path: Path, depth: int) -> None:
    """A CSV cell holds at most 131,072 characters: 60,000 levels still recurse out."""
    text = _plan_csv(tmp_path) + f'note,deep,"{"[" * depth + "]" * depth}"\n'
    with pytest.raises(InputError) as caught:
        parse_plan_csv(text, "plan.csv")
    lines = text.count("\n")
    assert str(caught.value) == f"plan.csv: line {lines}: bad JSON value: {NESTED}"


# Nothing from a file is obeyed by the terminal, or quoted from a file a scenario names.

def test_a_trace_naming_another_file_never_quotes_it(tmp_path: Path) -> None:
    """As root a scenario could name /etc/shadow as a trace: the error says where and
    what is wrong, never what the file holds."""
    from testbed.scenario.scenario import load_scenario
    from testbed.topology import load_topology

    topology = load_topology(TWO_DC)
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text("traces: [{link: east-west, csv: secret}]\n")
    for held, where in (("root:$6$s3cr3t:19000:0:99999:7:::\n", "secret: header"),
                        ("time_s,bandwidth\n0,s3cr3t\n", "secret: line 2.bandwidth"),
                        ("time_s,bandwidth\n0,1Gbit\n-1s3cr3t,2Gbit\n",
                         "secret: line 3.time_s")):
        (tmp_path / "secret").write_text(held)
        with pytest.raises(InputError) as caught:
            load_scenario(scenario, topology)
        assert where in str(caught.value) and "s3cr3t" not in str(caught.value)


def test_report_shows_escape_sequences_from_saved_files_and_never_sends_them(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, _, err = call(["compare", str(TWO_DC), "-p", "gpipe", "-p", "1f1b", "--out",
                         str(out)])
    assert code == 0, err
    saved = json.loads((out / "compare.json").read_text())
    saved["runs"][0]["policy"] = "gpipe\x1b]0;owned\x07\x1b[2J"
    saved["runs"][1].update(status="failed", error="boom\x1b]52;c;ZXZpbA==\x07")
    (out / "compare.json").write_text(json.dumps(saved))
    code, out_text, err = call(["report", str(out), "--no-plots"])
    assert code == 0, err
    assert "\x1b" not in out_text and "\x07" not in out_text
    assert "gpipe\\x1b]0;owned\\x07\\x1b[2J" in out_text
    assert "boom\\x1b]52;c;ZXZpbA==\\x07" in out_text
    assert "\x1b" not in (out / "table.md").read_text()
