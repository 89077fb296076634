"""Probing a run's state and a sweep's life as a careless or hostile user would, without
network namespaces: run state files of another version or damaged before `testbed down`,
sweeps SIGKILLed and sent Ctrl-C at random moments, a killed local Ray instance, failures
at 0 s, and what thousands of network events and a trace of millions of rows cost.

Every `down` here runs over a host of the script's own making (tests/private_host.py):
nothing of the machine's is touched. Writes benchmarks/soak-faults-state.json (`--out`);
docs/faults.md shows its table (scripts/docs_tables.py). `--quick` for a short pass.

    .venv/bin/python scripts/soak_faults_state.py [--quick] [--cycles N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.common.owners import process_start_ticks  # noqa: E402
from testbed.emulator.net import cleanup  # noqa: E402
from testbed.emulator.net.sweep import descendants  # noqa: E402
from testbed.emulator.net.sweep_leftovers import identity  # noqa: E402
from tests.private_host import gone_pid, private_host, run_record  # noqa: E402

COMMAND = str(Path(sys.executable).parent / "testbed")
"""The `testbed` command itself (its Ctrl-C handling is the command's)."""
GRID = ["--vary", "wan.latency=10ms,20ms,30ms,40ms,50ms,60ms", "--iterations", "400",
        "-p", "gpipe"]
"""Six points of about a second each, on two workers."""
EVENTS = (2_000, 4_000, 8_000, 20_001)
TRACE_ROWS = 4_000_000
LIMIT_S = 300.0
"""A case that takes longer is stopped and recorded as such."""


def _sweep(out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([COMMAND, "sweep", str(ROOT / "topologies" / "two-dc.yaml"),
                             *GRID, "--workers", "2", "--out", str(out), "--force", *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _descendants(pid: int) -> list[int]:
    """Every live process below `pid` (not `pid` itself)."""
    return [found for found in descendants(pid) if found != pid]


def _running(pids: list[int], limit: float) -> tuple[list[int], float]:
    """Those of `pids` still running after up to `limit` seconds, and the seconds waited."""
    began = time.monotonic()
    while (left := [p for p in pids if process_start_ticks(p) is not None]) and \
            time.monotonic() - began < limit:
        time.sleep(0.02)
    return left, time.monotonic() - began


def _kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def _clear(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def killed_sweeps(cycles: int, work: Path, rng: random.Random) -> dict[str, Any]:
    """A sweep SIGKILLed 0-3 s after it started (the workers start at about 0.5 s and
    load for a second or more): what it started must all be gone within 20 s."""
    failures, lasted = [], []
    for i in range(cycles):
        proc = _sweep(work / "killed")
        time.sleep(rng.uniform(0.0, 3.0))
        os.kill(proc.pid, signal.SIGSTOP)
        started = _descendants(proc.pid)
        _kill(proc)
        left, waited = _running(started, 20.0)
        lasted.append(waited)
        if left:
            failures.append(f"cycle {i + 1}: {len(left)} of {len(started)} left running")
            _clear(left)
        print(f"killed sweep {i + 1}/{cycles}: {len(started)} started, {len(left)} left",
              flush=True)
    return {"cycles": cycles, "failures": len(failures), "details": failures[:5],
            "seconds_to_go": {"max": round(max(lasted), 2)} if lasted else {}}


def orphaned_pools(cycles: int, work: Path) -> dict[str, Any]:
    """A sweep killed as its workers start, and they stopped before they could set their
    death signal (a pool forcibly orphaned): `down` must remove them all, and only them."""
    failures = []
    for i in range(cycles):
        proc = _sweep(work / "orphaned")
        mark = identity(proc.pid)
        while not _descendants(proc.pid) and proc.poll() is None:
            time.sleep(0.005)
        os.kill(proc.pid, signal.SIGSTOP)
        started = _descendants(proc.pid)
        for pid in started:
            os.kill(pid, signal.SIGSTOP)
        _kill(proc)
        with private_host(work / f"host-{i}", {mark}):
            report = cleanup.down()
        left, _ = _running(started, 5.0)
        if left or sorted(report.processes) != sorted(started):
            failures.append(f"cycle {i + 1}: {len(started)} orphaned, down removed "
                            f"{len(report.processes)}, {len(left)} left")
            _clear(left)
        print(f"orphaned pool {i + 1}/{cycles}: {len(started)} orphaned, down removed "
              f"{len(report.processes)}", flush=True)
    return {"cycles": cycles, "failures": len(failures), "details": failures[:5]}


def killed_ray(cycles: int, work: Path) -> dict[str, Any]:
    """`--ray local` SIGKILLed once its first point is done: `down` must leave none of
    Ray's processes and not its folder."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return {"skipped": "Ray is not installed"}
    failures = []
    for i in range(cycles):
        out = work / f"ray-{i}"
        proc = _sweep(out, "--ray", "local")
        mark = identity(proc.pid)
        points = out / "points.jsonl"
        while proc.poll() is None and not (points.exists() and points.read_text()):
            time.sleep(0.05)
        started = _descendants(proc.pid)
        _kill(proc)
        with private_host(work / f"host-ray-{i}", {mark}):
            report = cleanup.down()
        left, _ = _running(started, 10.0)
        folders = [f for f in report.folders if Path(f).exists()]
        if left or not report.folders or folders:
            failures.append(f"cycle {i + 1}: {len(left)} of {len(started)} left, folders "
                            f"{report.folders} ({len(folders)} still there)")
            _clear(left)
        print(f"killed Ray {i + 1}/{cycles}: {len(started)} started, down removed "
              f"{len(report.processes)} and {len(report.folders)} folder", flush=True)
    return {"cycles": cycles, "failures": len(failures), "details": failures[:5]}


def sweep_ctrl_c(cycles: int, work: Path, rng: random.Random) -> dict[str, Any]:
    """Ctrl-C (SIGINT to the process group) 0-9 s into a sweep, from loading to its end:
    exit 130 with `testbed: interrupted` last and no traceback (or 0 once it was done),
    and nothing left running."""
    failures, codes = [], {}
    for i in range(cycles):
        out = work / "ctrl-c"
        proc = _sweep(out)
        time.sleep(rng.uniform(0.0, 9.0))
        started = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        lines = [line for line in err.splitlines() if line]
        left, _ = _running(started, 10.0)
        codes[str(proc.returncode)] = codes.get(str(proc.returncode), 0) + 1
        good = "Traceback" not in err and not left and (
            (proc.returncode == 130 and lines[-1] == "testbed: interrupted")
            or (proc.returncode == 0 and (out / "sweep.csv").exists()))
        if not good:
            failures.append(f"cycle {i + 1}: exit {proc.returncode}, {len(left)} left: "
                            f"{err.strip()[-300:]}")
            _clear(left)
        print(f"Ctrl-C {i + 1}/{cycles}: exit {proc.returncode}", flush=True)
    return {"cycles": cycles, "failures": len(failures), "details": failures[:5],
            "exit_codes": codes}


def damaged_states(work: Path) -> dict[str, Any]:
    """`down` before four state files: another version's (a key this one does not know)
    and a damaged one whose owners live, a damaged one whose owner is gone, one that
    names no owner. The live runs and their workers stay, the dead one is undone, the
    ownerless one and every stray stay."""
    failures = []
    with private_host(work / "states") as host:
        owner, worker = host.owner_with_worker()
        host.write("r-next", run_record("r-next", owner, host.namespaces("tb1-a"), later=1))
        owner2, worker2 = host.owner_with_worker()
        host.write("r-changed", {**run_record("r-changed", owner2, []),
                                 "namespaces": {"hosts": host.namespaces("tb2-a")}})
        leftover = host.worker()
        host.write("r-dead", run_record("r-dead", gone_pid(), host.namespaces("tb3-a"),
                                        ready="yes", processes=[
                                            {"pid": leftover, "role": "worker:x",
                                             "start_ticks": process_start_ticks(leftover)}]))
        stray = host.worker()
        torn = host.write("r-torn", '{"run_id": "r-torn", "owner')
        report = cleanup.down()
        time.sleep(0.5)
        alive = {pid: process_start_ticks(pid) is not None
                 for pid in (worker, worker2, leftover, stray)}
        expected = {worker: True, worker2: True, leftover: False, stray: True}
        if alive != expected:
            failures.append(f"processes alive {alive}, expected {expected}")
        if host.present() != {"tb1-a", "tb2-a"}:
            failures.append(f"namespaces left {sorted(host.present())}")
        kept = sorted(p.stem for p in host.states.glob("*.json"))
        if kept != ["r-changed", "r-next", "r-torn"] or not torn.exists():
            failures.append(f"state files kept {kept}")
        if sorted(report.live) != ["r-changed", "r-next"]:
            failures.append(f"live runs {report.live}")
    return {"files": 4, "failures": len(failures), "details": failures}


def failures_at_start(work: Path) -> dict[str, Any]:
    """A scenario failure `at: 0s` in the simulator, with each `--on-failure`: it must be
    recorded, as one at 1 ms is."""
    failures = []
    for action in ("stop", "restart", "replan"):
        scenario = work / f"at-0-{action}.yaml"
        back = ", back: 1s" if action == "restart" else ""
        scenario.write_text(f"failures: [{{at: 0s, worker: east-1{back}}}]\n")
        out = work / f"at-0-{action}"
        subprocess.run([*_cli(), "simulate", str(ROOT / "topologies" / "two-dc.yaml"), "-p",
                        "gpipe", "--scenario", str(scenario), "--on-failure", action,
                        "--out", str(out), "--force"], capture_output=True, timeout=LIMIT_S,
                       check=False)
        results = json.loads((out / "results.json").read_text())
        recorded = [(f["worker"], f["at_s"]) for f in results.get("failures", [])]
        if recorded != [("east-1", 0.0)]:
            failures.append(f"{action}: failures recorded {recorded}, status "
                            f"{results.get('status')}")
    return {"cases": 3, "failures": len(failures), "details": failures}


def _cli() -> list[str]:
    return [sys.executable, "-c", "from testbed.cli.main import main; main()"]


def _timed(argv: list[str]) -> dict[str, Any]:
    """A command's wall time and peak memory (a process of its own), or that it ran past
    LIMIT_S."""
    probe = ("import resource, subprocess, sys, time\n"
             "began = time.monotonic()\n"
             f"done = subprocess.run(sys.argv[1:], capture_output=True, text=True, "
             f"timeout={LIMIT_S})\n"
             "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
             "print(time.monotonic() - began, peak, done.returncode)\n"
             "print(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else '')")
    try:
        done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True,
                              text=True, timeout=LIMIT_S + 30, check=True)
    except subprocess.SubprocessError:
        return {"seconds": None, "over_s": LIMIT_S}
    head, last = [*done.stdout.splitlines(), ""][:2]
    seconds, peak, code = head.split()
    return {"seconds": round(float(seconds), 2), "peak_mb": round(int(peak) / 1024),
            "exit": int(code), "said": last}


def event_scaling(work: Path, sizes: tuple[int, ...]) -> dict[str, Any]:
    """N network events, each lasting the rest of the run (all in force at once): the
    timed link changes they make (`changes`, in this process) and a whole `simulate` of
    two-dc with them in a scenario."""
    from testbed.topology import load_topology
    from testbed.topology.net_events import NetEvent, changes

    topology = load_topology(ROOT / "topologies" / "two-dc.yaml")
    out: dict[str, Any] = {}
    for n in sizes:
        events = [NetEvent(i * 0.001, "east", "west", "latency", 0.02 + i % 7 * 1e-3, None)
                  for i in range(n)]
        began = time.perf_counter()
        changes(events, topology)
        in_process = time.perf_counter() - began
        scenario = work / f"events-{n}.yaml"
        scenario.write_text("events:\n" + "".join(
            f"  - {{at: {e.at_s:.3f}s, link: [east, west], latency: {e.value * 1e3:g}ms}}\n"
            for e in events))
        run = _timed([*_cli(), "simulate", str(ROOT / "topologies" / "two-dc.yaml"), "-p",
                      "gpipe", "--scenario", str(scenario), "--out", str(work / "events"),
                      "--force"])
        run.pop("said", None)
        out[str(n)] = {"changes_s": round(in_process, 3), "simulate": run}
        print(f"{n} events: changes {in_process:.3f} s, simulate {run}", flush=True)
    return out


def long_trace(work: Path, rows: int) -> dict[str, Any]:
    """A trace of `rows` one-line rows (`i,1Gbit`): how long and how much memory until
    it is refused."""
    trace = work / "long.csv"
    with trace.open("w") as handle:
        handle.write("time_s,bandwidth\n")
        handle.writelines(f"{i},1Gbit\n" for i in range(rows))
    scenario = work / "long.yaml"
    scenario.write_text("traces: [{link: [east, west], csv: long.csv}]\n")
    run = _timed([*_cli(), "simulate", str(ROOT / "topologies" / "two-dc.yaml"), "-p",
                  "gpipe", "--scenario", str(scenario), "--out", str(work / "trace"),
                  "--force"])
    size = trace.stat().st_size
    trace.unlink()
    print(f"trace of {rows:,} rows: {run}", flush=True)
    return {"rows": rows, "bytes": size, **run}


def table(report: dict[str, Any]) -> str:
    """docs/faults.md's table of these cases."""
    rows = ["| case | result |", "| --- | --- |"]

    def failed(part: dict[str, Any]) -> str:
        return f"{part.get('failures', '?')} failures"

    if "damaged_states" in report:
        rows.append("| `down` before state files of another version, damaged with a live "
                    "and a dead owner, and naming no owner | "
                    f"{failed(report['damaged_states'])} |")
    for key, what in (("killed_sweeps", "sweeps SIGKILLed 0-3 s in (2 workers)"),
                      ("orphaned_pools", "pools forcibly orphaned, then `down`"),
                      ("killed_ray", "`--ray local` SIGKILLed, then `down`"),
                      ("sweep_ctrl_c", "Ctrl-C 0-9 s into a sweep")):
        part = report.get(key)
        if part is None:
            continue
        if "skipped" in part:
            rows.append(f"| {what} | not run: {part['skipped']} |")
            continue
        extra = ""
        if key == "killed_sweeps" and part.get("seconds_to_go"):
            extra = f"; all gone within {part['seconds_to_go']['max']:g} s"
        if key == "sweep_ctrl_c":
            extra = "; exit codes " + ", ".join(f"{c}: {n}" for c, n in
                                                sorted(part["exit_codes"].items()))
        rows.append(f"| {part['cycles']} {what} | {failed(part)}{extra} |")
    if "failures_at_start" in report:
        rows.append("| a scenario failure `at: 0s`, each `--on-failure` | "
                    f"{failed(report['failures_at_start'])} |")
    for n, figures in report.get("event_scaling", {}).items():
        run = figures["simulate"]
        took = f"{run['seconds']:g} s" if run.get("seconds") is not None else \
            f"over {run['over_s']:g} s"
        rows.append(f"| {int(n):,} network events in force at once | link changes "
                    f"{figures['changes_s']:g} s; whole `simulate` {took} |")
    trace = report.get("long_trace")
    if trace:
        took = f"{trace['seconds']:g} s, {trace['peak_mb']:,} MB peak" \
            if trace.get("seconds") is not None else f"over {trace['over_s']:g} s"
        rows.append(f"| a trace of {trace['rows']:,} rows | refused in {took}: "
                    f"`{trace.get('said', '').split('.csv: ', 1)[-1]}` |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 cycles of each, fewer events")
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" /
                        "soak-faults-state.json")
    args = parser.parse_args()
    cycles = 3 if args.quick else args.cycles
    rng = random.Random(args.seed)
    report: dict[str, Any] = {"cycles": cycles}
    with tempfile.TemporaryDirectory(prefix="soak-state-") as folder:
        work = Path(folder)
        cases: list[tuple[str, Callable[[], dict[str, Any]]]] = [
            ("damaged_states", lambda: damaged_states(work)),
            ("killed_sweeps", lambda: killed_sweeps(cycles, work, rng)),
            ("orphaned_pools", lambda: orphaned_pools(cycles, work)),
            ("killed_ray", lambda: killed_ray(max(1, cycles // 4), work)),
            ("sweep_ctrl_c", lambda: sweep_ctrl_c(cycles, work, rng)),
            ("failures_at_start", lambda: failures_at_start(work)),
            ("event_scaling", lambda: event_scaling(work, EVENTS[:2] if args.quick
                                                    else EVENTS)),
            ("long_trace", lambda: long_trace(work, 200_000 if args.quick else TRACE_ROWS))]
        for name, case in cases:
            report[name] = case()
    report["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(table(report))
    bad = sum(part.get("failures", 0) for part in report.values() if isinstance(part, dict))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
