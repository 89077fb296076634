"""Sweeps of any knob: every --set key, policy options, bubble policies, jitter, repeats
and events; points in parallel (local processes, Ray) with the same rows; an interrupted
sweep goes on with the points it has."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed import api
from testbed.experiments.inputs import load_inputs
from testbed.experiments.sweep import vary
from testbed.experiments.sweep_store import POINTS_FILE
from testbed.plan.jitter import parse_jitter
from testbed.run.spec import RunSpec

from .conftest import TOPOLOGIES
from .test_cli import call

TWO_DC = TOPOLOGIES / "two-dc.yaml"
PAPER = TOPOLOGIES / "paper-3dc.yaml"
GRID = ["--vary", "wan.latency=10ms,40ms", "--vary", "microbatches=2,4", "-p", "gpipe",
        "-p", "1f1b", "--iterations", "2"]


def _sweep(out: Path, *args: str) -> tuple[int, str, str]:
    return call(["sweep", str(TWO_DC), *args, "--out", str(out)])


def _rows(out: Path) -> list[dict[str, str]]:
    with (out / "sweep.csv").open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize(("key", "value", "check"), [
    ("wan.bandwidth", "10Gbit", lambda t: t.links[0].bandwidth_bps == 10e9),
    ("wan.latency", "5ms", lambda t: t.links[0].latency_s == 0.005),
    ("wan.west-east.latency", "7ms", lambda t: t.links[0].latency_s == 0.007),
    ("tcp.wmem", "64MiB", lambda t: t.tcp.wmem[2] == 64 << 20),
    ("tcp.slow_start_after_idle", "false", lambda t: not t.tcp.slow_start_after_idle),
    ("dc.gpus", "4", lambda t: t.total_gpus == 8),
    ("dc.east.gpus", "3", lambda t: t.dc("east").gpus == 3),
    ("dcs", "1", lambda t: len(t.datacenters) == 1 and not t.links),
])
def test_set_turns_every_topology_knob_that_vary_turns(key: str, value: str,
                                                       check: object) -> None:
    """`--set wan.bandwidth=...` was refused while `--vary wan.bandwidth` worked."""
    base = load_inputs(TWO_DC)
    topology = load_inputs(TWO_DC, sets=(f"{key}={value}",)).topology
    assert callable(check) and check(topology)
    assert topology == vary(base.topology, base.job, key, value)[0]
    code, out, err = call(["validate", str(TWO_DC), "--set", f"{key}={value}"])
    assert code == 0 and "ok: topology" in out, err


def test_workers_write_the_same_csv_as_one_process(tmp_path: Path) -> None:
    code, _, err = _sweep(tmp_path / "one", *GRID, "--workers", "1")
    assert code == 0, err
    code, _, err = _sweep(tmp_path / "two", *GRID, "--workers", "2")
    assert code == 0, err
    one = (tmp_path / "one" / "sweep.csv").read_text()
    assert one == (tmp_path / "two" / "sweep.csv").read_text()
    rows = _rows(tmp_path / "one")
    assert len(rows) == 8 and all(r["iteration_s"] and not r["error"] for r in rows)
    assert [r["policy"] for r in rows[:2]] == ["gpipe", "1f1b"]
    assert all(r["speedup"] == "1.0" for r in rows if r["policy"] == "gpipe")


def test_the_printed_table_has_a_header_row(tmp_path: Path) -> None:
    """Rows were printed without one: which column was which was left to guess."""
    code, out, err = _sweep(tmp_path / "one", *GRID, "--workers", "1")
    assert code == 0, err
    header, rule, first, *_ = out.splitlines()
    row = _rows(tmp_path / "one")[0]
    target = float(row["target_loss"])  # the default: the synchronous loss at the budget
    assert [h.strip() for h in header.split("  ") if h] == [
        "policy", "wan.latency", "microbatches", "iteration (s)", "speed-up",
        "effective tokens/s", f"time to loss {target:.4g}"]
    assert set(rule) == {"-", " "}
    iteration = float(row["iteration_s"])
    assert first.split()[:5] == ["gpipe", "10ms", "2", f"{iteration:.3f}", "1.00x"]
    assert first.split()[5] == f"{float(row['effective_tokens_per_s']):.0f}"


RAY_TESTS = ("test_ray_local_writes_the_same_csv_as_one_process",
             "test_ray_cluster_at_an_address_runs_the_points",
             "test_ray_refuses_an_address_nothing_answers_before_making_anything")
NO_RAY = "Ray is an optional extra (pip install '.[ray]') that is not installed here"


@pytest.fixture
def needs_ray() -> None:
    pytest.importorskip("ray", reason=NO_RAY)


@pytest.mark.usefixtures("needs_ray")
def test_ray_local_writes_the_same_csv_as_one_process(tmp_path: Path) -> None:
    code, _, err = _sweep(tmp_path / "one", *GRID, "--workers", "1")
    assert code == 0, err
    code, _, err = _sweep(tmp_path / "ray", *GRID, "--workers", "2", "--ray", "local")
    assert code == 0, err
    assert (tmp_path / "one" / "sweep.csv").read_text() == \
        (tmp_path / "ray" / "sweep.csv").read_text()
    assert "on Ray (local)" in err
    assert not [p for p in Path("/tmp").glob("testbed-ray-*") if p.stat().st_uid == os.getuid()
                and p.stat().st_mtime > time.time() - 60]


SMALL = ["--iterations", "3", "--microbatches", "4", "--set", "model.layers=6", "--set",
         "model.hidden=1024", "--set", "model.heads=8", "--set", "inference.arrival_rate=50/s"]


def test_each_row_is_the_run_its_flags_give(tmp_path: Path) -> None:
    """Policy options, bubble policies, jitter, repeats and events as knobs: every row is
    what `simulate` (api.run) gives with the same settings."""
    code, _, err = call([
        "sweep", str(PAPER), "-p", "1f1b", "--vary", "option.1f1b.sends=torch,eager",
        "--vary", "jitter=0,10%", "--vary", "event=none;at=0.05s,link=east-central,latency=80ms",
        "-b", "none", "-b", "greedy", "--repeat", "2", *SMALL, "--out", str(tmp_path)])
    assert code == 0, err
    rows = _rows(tmp_path)
    assert len(rows) == 2 * 2 * 2 * 2 * 2
    inputs = load_inputs(PAPER, None, tuple(SMALL[5::2]), iterations=3, microbatches=4)
    for row in rows[::5]:  # a spread of them: each costs a run
        jitter = parse_jitter(row["jitter"])  # "0": no noise at all, equal shares too
        events = () if row["event"] == "none" else \
            load_inputs(PAPER, events=(row["event"],)).events
        repeat = int(row["repeat"]) - 1
        spec = RunSpec.build("simulate", inputs.topology, inputs.job, policy="1f1b",
                             policy_options={"sends": row["option.1f1b.sends"]},
                             bubble_policy=row["bubble"], bubble_options={}, events=events,
                             jitter=jitter.with_seed(repeat))
        result = api.run(spec, tmp_path / "runs" / str(rows.index(row)))
        assert float(row["iteration_s"]) == result.iteration_s
        assert int(row["served"]) == result.results["inference"]["served"]
        assert float(row["gpu_utilization_total"]) == \
            result.results["gpu_utilization"]["total"]
    by = {(r["option.1f1b.sends"], r["jitter"], r["event"], r["bubble"], r["repeat"]):
          float(r["iteration_s"]) for r in rows}
    assert by[("torch", "10%", "none", "none", "1")] != by[("torch", "10%", "none", "none", "2")]
    assert by[("torch", "0", "none", "none", "1")] == by[("torch", "0", "none", "none", "2")]
    assert by[("eager", "0", "none", "none", "1")] != by[("torch", "0", "none", "none", "1")]
    assert by[("torch", "0", "none", "none", "1")] != \
        by[("torch", "0", "at=0.05s,link=east-central,latency=80ms", "none", "1")]
    assert all(int(r["served"]) > 0 for r in rows if r["bubble"] == "greedy")
    assert all(r["served"] == "0" for r in rows if r["bubble"] == "none")


@pytest.mark.parametrize(("args", "expected"), [
    (["--vary", "wan.bandwith=1Gbit"], "--vary: wan.bandwith: unknown key"),
    (["--vary", "wan.bandwidth=1Gbit,fast"],
     "--vary: wan.bandwidth: expected a rate like '10Gbit', got 'fast'"),
    (["--vary", "microbatches=2,0"], "--vary: microbatches: must be positive, got 0"),
    (["--vary", "option.1f1b.send=eager"],
     "--vary: option.1f1b.send: unknown option 'send' for 1f1b (did you mean 'sends'?)"),
    (["--vary", "option.atlas.connections=1"], "--vary: option.atlas.connections: "
     "'atlas.connections=1' is for 'atlas', which is not compared here"),
    (["--vary", "1f1b.sends=eager"], "(a policy option is swept as option.1f1b.sends)"),
    (["--vary", "jitter=10%,lots"], "--vary: jitter: expected a fraction"),
    (["--vary", "event=at=1s,link=east-north,down=1s"], "--vary: event: link: no WAN link"),
    (["--vary", "dcs=1,2", "--vary", "dcs=2"], "--vary: dcs is varied twice"),
    (["--vary", "microbatches"], "--vary: expected KEY=V1,V2,..."),
    (["--vary", "dcs=1", "--workers", "0"], "--workers: must be at least 1, got 0"),
    (["--vary", "dcs=1", "-b", "greedyy"], "unknown bubble policy 'greedyy'"),
    (["--vary", "dcs=1", "-b", "greedy"], "-b: a bubble policy needs an inference workload"),
])
def test_a_bad_knob_is_one_line_naming_it(tmp_path: Path, args: list[str],
                                          expected: str) -> None:
    code, _, err = _sweep(tmp_path / "out", "-p", "1f1b", *args)
    assert code == 2 and err.startswith("testbed: error: ") and err.count("\n") == 1, err
    assert expected in err
    assert not (tmp_path / "out").exists()


def test_a_sweep_cut_short_goes_on_with_the_points_it_has(tmp_path: Path) -> None:
    code, _, err = _sweep(tmp_path / "whole", *GRID)
    assert code == 0, err
    code, _, err = _sweep(tmp_path / "cut", *GRID)
    assert code == 0, err
    saved = tmp_path / "cut" / POINTS_FILE
    first = saved.read_text().splitlines()[0]
    saved.write_text(first + "\n" + first[:40])  # a kill mid-line leaves half a line
    (tmp_path / "cut" / "sweep.csv").unlink()
    code, _, err = _sweep(tmp_path / "cut", *GRID, "--workers", "2")
    assert code == 0, err
    assert "going on with 1 point of 4 done" in err
    assert (tmp_path / "cut" / "sweep.csv").read_text() == \
        (tmp_path / "whole" / "sweep.csv").read_text()
    code, _, err = _sweep(tmp_path / "cut", *GRID[:-1], "3")
    assert code == 2 and "holds another sweep (its job differ" in err
    code, _, err = _sweep(tmp_path / "cut", *GRID[:-1], "3", "--force")
    assert code == 0 and "going on" not in err


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


@pytest.mark.parametrize(("workers", "signum", "code"), [
    ("2", signal.SIGTERM, 143),
    pytest.param("1", signal.SIGTERM, 143, marks=pytest.mark.benchmark),
    ("1", signal.SIGINT, 130)])
def test_a_stopped_sweep_stops_its_workers_and_keeps_its_points(
        tmp_path: Path, workers: str, signum: int, code: int) -> None:
    """In this process, a signal landing in Atlas's planning (a policy's code) stopped
    nothing: the policy's guard made it a failed run, and the sweep went on. With two
    workers the signal comes once two points are in, as the last one plans (the same
    command then has one point left to run)."""
    out = tmp_path / "out"
    args = [str(Path(sys.executable).parent / "testbed"), "sweep", str(PAPER), "-p", "atlas",
            "--vary", "wan.latency=10ms,20ms,40ms", "--workers", workers,
            "--out", str(out)]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    deadline = time.monotonic() + 120
    while not ((out / POINTS_FILE).exists()
               and len((out / POINTS_FILE).read_text().splitlines()) >= int(workers)):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    children = _children(process.pid)
    process.send_signal(signum)
    _, err = process.communicate(timeout=60)
    assert process.returncode == code, err
    assert "of 3 points; the same command with --out" in err
    time.sleep(0.5)
    assert not [c for c in children if Path(f"/proc/{c}").exists()
                and Path(f"/proc/{c}/stat").read_text().split()[2] != "Z"]
    if workers == "1":
        return
    kept = len((out / POINTS_FILE).read_text().splitlines())
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert f"going on with {kept} point" in done.stderr
    assert len(_rows(out)) == 3


@pytest.mark.usefixtures("needs_ray")
def test_ray_cluster_at_an_address_runs_the_points(tmp_path: Path) -> None:
    head = subprocess.Popen([sys.executable, str(Path(__file__).parent / "ray_head.py")],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert head.stdout is not None
        address = head.stdout.readline().strip()
        assert address, "the Ray head printed no address"
        code, _, err = _sweep(tmp_path / "cluster", *GRID, "--ray", address)
        assert code == 0, err
        assert f"on Ray ({address})" in err
    finally:
        head.terminate()
        head.wait(timeout=60)
    code, _, err = _sweep(tmp_path / "one", *GRID, "--workers", "1")
    assert code == 0, err
    assert (tmp_path / "one" / "sweep.csv").read_text() == \
        (tmp_path / "cluster" / "sweep.csv").read_text()


@pytest.mark.usefixtures("needs_ray")
def test_ray_refuses_an_address_nothing_answers_before_making_anything(
        tmp_path: Path) -> None:
    code, _, err = _sweep(tmp_path / "out", *GRID, "--ray", "127.0.0.1:1")
    assert code == 2 and err == "testbed: error: --ray: no Ray cluster answers at " \
        "'127.0.0.1:1': Connection refused\n"
    assert not (tmp_path / "out").exists()


def test_without_ray_its_tests_are_skipped_saying_why(tmp_path: Path) -> None:
    """scripts/setup says the Ray tests will not run where Ray cannot be installed: they
    failed there instead. Here Ray is hidden from a pytest of its own."""
    hidden = tmp_path / "ray"
    hidden.mkdir()
    (hidden / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'ray'\", name='ray')\n")
    tests = [f"{__file__}::{name}" for name in RAY_TESTS]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *tests],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(tmp_path), os.environ.get("PYTHONPATH", "")])},
        cwd=Path(__file__).parent.parent)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 skipped" in done.stdout, done.stdout
    assert done.stdout.count(NO_RAY) == 3, done.stdout


def test_local_workers_plan_on_their_share_of_the_cores() -> None:
    """Each of a sweep's N local workers runs points of its own: Atlas's planning in one
    spreads over its share of the cores, not over all of them N times."""
    code = "\n".join([
        "import os",
        "from testbed.experiments.inputs import load_inputs",
        "from testbed.policy import training_policy",
        "from testbed.experiments.planning import planning_context",
        "from testbed.experiments.sweep_workers import _worker_start",
        f"inputs = load_inputs({str(PAPER)!r})",
        "_worker_start(2, os.getppid())",
        "atlas = training_policy('atlas')",
        "context = planning_context(inputs.topology, inputs.job, atlas, {})",
        "print(context.processes, len(os.sched_getaffinity(0)))"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    processes, every = map(int, done.stdout.split())
    assert processes == max(1, every // 2)


def test_with_a_target_each_points_rows_are_sorted_by_time_to_loss() -> None:
    from testbed.experiments.sweep import by_time_to_loss

    rows = [{"wan.latency": "10ms", "policy": "a", "time_to_loss_s": 9.0},
            {"wan.latency": "10ms", "policy": "b", "time_to_loss_s": None},
            {"wan.latency": "10ms", "policy": "c", "time_to_loss_s": 3.0},
            {"wan.latency": "50ms", "policy": "a", "time_to_loss_s": 1.0},
            {"wan.latency": "50ms", "policy": "c", "time_to_loss_s": 2.0}]
    assert [(r["wan.latency"], r["policy"]) for r in by_time_to_loss(rows, ["wan.latency"])] \
        == [("10ms", "c"), ("10ms", "a"), ("10ms", "b"), ("50ms", "a"), ("50ms", "c")]


def test_a_sweep_row_has_the_typical_iteration_as_compare_does() -> None:
    """A DiLoCo cycle's mean, not its median step without the sync (about 0 s)."""
    from dataclasses import replace

    from testbed.experiments.run import simulated
    from testbed.experiments.sweep import row_metrics
    from testbed.report.run_results import CycleTimes, IterationTimes

    inputs = load_inputs(TWO_DC, sets=("iterations=2",))
    typed = simulated(RunSpec.build("simulate", inputs.topology, inputs.job,
                                    policy="gpipe")).typed()
    cycle = replace(typed, iteration_time_s=IterationTimes(
        0.001, 0.001, 4.99, 0.5, [0.001] * 9 + [4.99]), cycle_time_s=CycleTimes(5.0, 10, 1))
    assert row_metrics(cycle)["iteration_s"] == 0.5
    steady = replace(typed, iteration_time_s=IterationTimes(0.2, 0.2, 0.3, 0.25,
                                                            [0.3, 0.2, 0.2]))
    assert row_metrics(steady)["iteration_s"] == 0.2
    failed = replace(typed, iteration_time_s=IterationTimes(None, None, None, None, []))
    assert row_metrics(failed)["iteration_s"] is None
    assert row_metrics(typed)["tokens_per_s"] == typed.tokens_per_s > 0
