"""Soak cases for faults a live run must survive or report: strangers dialling the workers,
`down` racing `up`, a killed delay line, SIGTERM to the workers (as root); and probes of
input that sets how much a command does (`bounds_probes`, no root needed): each must be
refused in one line, or taken, within its time. Used by scripts/soak.py and, for the
probes, by a benchmark test (tests/test_bounds.py)."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTBED = [sys.executable, "-c", "from testbed.cli.main import main; main()"]
Leftovers = Callable[[], dict[str, int]]


def _up(topology: Path, out: Path, iterations: int, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([*TESTBED, "up", str(topology), "-p", "gpipe", "--compute",
                             "emulated", "--iterations", str(iterations), "--force", "--out",
                             str(out), *extra], stderr=subprocess.PIPE,
                            stdout=subprocess.DEVNULL, text=True, cwd=ROOT)


def _until_training(proc: subprocess.Popen[str], lines: list[str]) -> bool:
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("iteration 2/"):
            return True
    return False


def _run_state(owner: int) -> Any:
    from testbed.emulator.net.state import all_states

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for state in all_states():
            if state.owner_pid == owner:
                return state
        time.sleep(0.1)
    raise RuntimeError(f"no run state for process {owner}")


def _pids(state: Any, role: str) -> list[int]:
    return [p.pid for p in state.processes if p.role.startswith(role)]


def _listening(pid: int) -> list[tuple[str, int]]:
    """Addresses a process's network namespace listens on (IPv4, from /proc)."""
    out = []
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        if state == "0A":
            address, port = local.split(":")
            octets = [str(int(address[i:i + 2], 16)) for i in (6, 4, 2, 0)]
            out.append((".".join(octets), int(port, 16)))
    return out


INTRUDER = """
import socket, sys, os
from testbed.emulator.runtime.wire.protocol import pack_hello
host, port = sys.argv[1], int(sys.argv[2])
for payload in (b"", b"GET / HTTP/1.0\\r\\n\\r\\n", pack_hello(os.urandom(32), 0, 0),
                b"\\xff" * 4096):
    with socket.create_connection((host, port), timeout=5) as s:
        s.sendall(payload)
"""


def _finish(proc: subprocess.Popen[str], lines: list[str], timeout: float) -> str:
    _out, err = proc.communicate(timeout=timeout)
    return "".join(lines) + (err or "")


def stray_connections(cycles: int, topology: Path, out: Path,
                      leftovers: Leftovers) -> dict[str, Any]:
    """Strangers (empty, garbage, a hello with a wrong secret, noise) dial every worker
    mid-training, from another worker's namespace; the run must finish as if nothing
    happened."""
    failures = []
    for i in range(cycles):
        proc = _up(topology, out / "stray", 40)
        lines: list[str] = []
        ok = _until_training(proc, lines)
        state = _run_state(proc.pid)
        workers = _pids(state, "worker:")
        dialled = 0
        for target in workers:
            source = next(p for p in workers if p != target)
            for host, port in _listening(target):
                subprocess.run(["nsenter", f"--net=/proc/{source}/ns/net", sys.executable, "-c",
                                INTRUDER, host, str(port)], cwd=ROOT, check=False,
                               capture_output=True, timeout=30)
                dialled += 1
        text = _finish(proc, lines, 300)
        good = ok and proc.returncode == 0 and dialled >= len(workers)
        if not good or any(leftovers().values()):
            failures.append(f"cycle {i + 1}: exit {proc.returncode}: {text.strip()[-300:]}")
        print(f"stray connections {i + 1}/{cycles}: {dialled} ports dialled, exit "
              f"{proc.returncode}", flush=True)
    return {"cycles": cycles, "failures": len(failures), "details": failures[:5]}


def down_racing_up(cycles: int, topology: Path, out: Path,
                   leftovers: Leftovers) -> dict[str, Any]:
    """`down` started at a random moment of a starting or training run: the run must not
    notice, `down` must leave it alone."""
    failures = []
    rng = random.Random(1)
    for i in range(cycles):
        proc = _up(topology, out / "race", 20)
        time.sleep(rng.uniform(0.0, 3.0))
        down = subprocess.run([*TESTBED, "down"], capture_output=True, text=True, cwd=ROOT,
                              timeout=120)
        text = _finish(proc, [], 300)
        stopped = re.search(r"stopped (\d+) live", down.stdout)
        good = proc.returncode == 0 and down.returncode == 0 and not stopped
        if not good or any(leftovers().values()):
            failures.append(f"cycle {i + 1}: up exit {proc.returncode}, down "
                            f"{down.stdout.strip()} {down.stderr.strip()}: {text.strip()[-300:]}")
        print(f"down racing up {i + 1}/{cycles}: up exit {proc.returncode}, down: "
              f"{down.stdout.strip()}", flush=True)
    return {"cycles": cycles, "failures": len(failures), "details": failures[:5]}


def killed_delay_line(cycles: int, topology: Path, out: Path,
                      leftovers: Leftovers) -> dict[str, Any]:
    """A delay line SIGKILLed mid-training: the run must end within seconds naming it, and
    leave nothing behind."""
    failures, delays = [], []
    for i in range(cycles):
        proc = _up(topology, out / "delayline", 1_000_000, "--shaper", "userspace")
        lines: list[str] = []
        ok = _until_training(proc, lines)
        state = _run_state(proc.pid)
        victim = _pids(state, "delayline:")[0]
        killed = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        text = _finish(proc, lines, 120)
        delays.append(time.monotonic() - killed)
        named = "delay line" in text.splitlines()[-1] if text.strip() else False
        if not (ok and proc.returncode == 1 and named) or any(leftovers().values()):
            failures.append(f"cycle {i + 1}: exit {proc.returncode}: {text.strip()[-300:]}")
        print(f"killed delay line {i + 1}/{cycles}: exit {proc.returncode} after "
              f"{delays[-1]:.1f} s", flush=True)
    return {"cycles": cycles, "failures": len(failures), "details": failures[:5],
            "seconds_to_end": {"max": round(max(delays), 2)} if delays else {}}


def sigterm_workers(cycles: int, topology: Path, out: Path,
                    leftovers: Leftovers) -> dict[str, Any]:
    """Every worker SIGTERMed mid-training: the run fails naming a worker, no worker log
    holds a torn connection (uvloop's 'Fatal error on transport'), nothing is left."""
    failures = []
    for i in range(cycles):
        proc = _up(topology, out / "sigterm", 1_000_000)
        lines: list[str] = []
        ok = _until_training(proc, lines)
        for pid in _pids(_run_state(proc.pid), "worker:"):
            os.kill(pid, signal.SIGTERM)
        text = _finish(proc, lines, 120)
        torn = [p.name for p in (out / "sigterm" / "logs").glob("*.log")
                if "Fatal error" in p.read_text(errors="replace")]
        if not ok or proc.returncode != 1 or torn or any(leftovers().values()):
            failures.append(f"cycle {i + 1}: exit {proc.returncode}, torn {torn}: "
                            f"{text.strip()[-200:]}")
        print(f"SIGTERM workers {i + 1}/{cycles}: exit {proc.returncode}, torn logs {torn}",
              flush=True)
    return {"cycles": cycles, "failures": len(failures), "details": failures[:5]}



# --- probes of what sets how much a command does (no root) -----------------------------

PYTHON = [sys.executable, "-c"]
TWO_DC = ROOT / "topologies" / "two-dc.yaml"
PAPER = ROOT / "topologies" / "paper-3dc.yaml"
Setup = Callable[[Path], None]


@dataclass(frozen=True)
class Probe:
    """One hostile or careless input: `command` (testbed's arguments, or PYTHON and a
    snippet; `{dir}` is the probe's own folder, where `files` are written and `setup` runs
    first) must end with exit status `code` within `seconds`, its last line of stderr (of
    stdout for exit 0 and `stdout`) holding `says`, and no traceback."""

    name: str
    command: list[str]
    code: int
    says: str
    files: dict[str, str] = field(default_factory=dict)
    setup: Setup | None = None
    seconds: float = 60.0
    stdout: bool = False
    path: str | None = None
    """Put before Python's path (PYTHONPATH), as `command` is."""


def _testbed(*args: str) -> list[str]:
    return [*TESTBED, *args]


def _stragglers(count: int) -> str:
    return "stragglers:\n" + "  - {at: 0s, gpu: east-0, slower: 1000}\n" * count


def _plan_with(connections: int) -> Setup:
    def setup(folder: Path) -> None:
        subprocess.run(_testbed("plan", str(TWO_DC), "-p", "gpipe", "--csv",
                                str(folder / "p.csv")), check=True, capture_output=True,
                       cwd=ROOT, timeout=120)
        text = (folder / "p.csv").read_text()
        (folder / "p.csv").write_text(text.replace("conn,east-0,west-0,1\n",
                                                   f"conn,east-0,west-0,{connections}\n"))
    return setup


def _spans(times: list[tuple[str, str]]) -> str:
    rows = ", ".join(f'{{"gpu": "east-0", "kind": "forward", "start": {a}, "end": {b}, '
                     f'"stage": 0, "iteration": 1}}' for a, b in times)
    return f'{{"start": 0, "spans": [{rows}]}}'


SWEEP = ("sweep", str(TWO_DC), "-p", "gpipe", "--vary", "wan.latency=1ms,2ms",
         "--iterations", "2", "--workers", "1")


def _swept(change: Callable[[Path], None]) -> Setup:
    def setup(folder: Path) -> None:
        subprocess.run(_testbed(*SWEEP, "--out", str(folder / "sweep")), check=True,
                       capture_output=True, cwd=ROOT, timeout=300)
        change(folder / "sweep" / "points.jsonl")
    return setup


def _nan_row(points: Path) -> None:
    points.write_text(points.read_text().replace('"iteration_s": ', '"iteration_s": NaN, '
                                                 '"was": ', 1))


def _fifo(points: Path) -> None:
    points.unlink()
    os.mkfifo(points)


def _simulated(folder: Path) -> None:
    subprocess.run(_testbed("simulate", str(TWO_DC), "-p", "gpipe", "--out",
                            str(folder / "run")), check=True, capture_output=True, cwd=ROOT,
                   timeout=120)
    results = folder / "run" / "results.json"
    data = json.loads(results.read_text())
    results.write_text(json.dumps({**data, "iterations": -3}))


def _hostile_plugins(folder: Path) -> None:
    """tests/fixtures/hostile_plugin installed into the probe's folder (from its source:
    no index), as the tests install it."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(folder / "site"),
                    str(ROOT / "tests" / "fixtures" / "hostile_plugin")], check=True,
                   capture_output=True, cwd=folder, timeout=300,
                   env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


def _checkpointed(folder: Path) -> None:
    """A checkpoint as `up --checkpoint-every` leaves it (no run: no root), its topology
    then edited."""
    code = ("import sys; from pathlib import Path\n"
            "from testbed.experiments.inputs import load_inputs\n"
            "from testbed.run.checkpoint import Progress\n"
            "from testbed.emulator.resume import save_settings\n"
            "from testbed.run.spec import RunSpec\n"
            f"inputs = load_inputs(Path({str(TWO_DC)!r}))\n"
            "spec = RunSpec.build('emulate', inputs.topology, inputs.job, policy='gpipe', "
            "checkpoint_every=1)\n"
            "Path(sys.argv[1]).mkdir(parents=True)  # a run's directory, as up makes it\n"
            "save_settings(Path(sys.argv[1]), spec, 'emulated', 1)\n"
            "(Path(sys.argv[1]) / 'checkpoint' / 'state.json').write_text("
            "Progress(1, {}, [], 1, 1).as_json())\n")
    subprocess.run([*PYTHON, code, str(folder / "run")], check=True, capture_output=True,
                   cwd=ROOT, timeout=120)
    topology = folder / "run" / "checkpoint" / "topology.yaml"
    topology.write_text(topology.read_text().replace("gpus: 2", "gpus: 3", 1))


RESUME = ("import sys; from pathlib import Path\n"
          "from testbed.cli.main import main\n"
          "from testbed.emulator.resume import load_resumption\n"
          "from testbed.errors import TestbedError\n"
          "try:\n    load_resumption(Path(sys.argv[1]))\n"
          "except TestbedError as exc:\n    sys.exit(f'testbed: error: {exc}')\n")
SUGGESTED = ("from testbed.emulator.runtime.coordinator.health import assess\n"
             "print(assess(1.0, [0.001], None, 1).behind(3000.0, 1.0).warning())\n")


def bounds_probes() -> list[Probe]:
    """Inputs that set how much a command does or how long a run lasts, past their
    bounds: each item of issue-style probing, as a user would type it."""
    return [
        Probe("stacked stragglers", _testbed(
            "simulate", str(TWO_DC), "--scenario", "{dir}/s.yaml", "--out", "{dir}/o"), 2,
            "overlapping stragglers multiply", {"s.yaml": _stragglers(8)}),
        Probe("a run longer than the clock holds", _testbed(
            "simulate", str(TWO_DC), "-p", "gpipe", "--event",
            "at=0s,link=east-west,down=1e11s", "--out", "{dir}/o"), 1,
            "the run was still going after 1e+10 s"),
        Probe("a billion repeats, compare", _testbed(
            "compare", str(TWO_DC), "-p", "gpipe", "--repeat", "1000000000", "--out",
            "{dir}/o"), 2, "--repeat: must be from 1 to 1,000"),
        Probe("a billion repeats, sweep", _testbed(
            *SWEEP, "--repeat", "1000000000", "--out", "{dir}/o"), 2,
            "--repeat: must be from 1 to 1,000"),
        Probe("1e12 requests/s", _testbed(
            "simulate", str(PAPER), "-p", "1f1b", "--pp", "4", "-b", "greedy", "--set",
            "inference.arrival_rate=1e12/s", "--out", "{dir}/o"), 2,
            "must be from 0/s to 100,000/s"),
        Probe("more workers than cores", _testbed(
            *SWEEP[:-1], "24", "--out", "{dir}/o"), 0, "run at once", seconds=300),
        Probe("a hundred million connections", _testbed(
            "simulate", str(TWO_DC), "--plan", "{dir}/p.csv", "--out", "{dir}/o"), 2,
            "have 100,000,000 TCP connections between them", setup=_plan_with(100_000_000)),
        Probe("extreme span times", _testbed("profile", "{dir}/run", "-o", "{dir}/p.json"),
              2, "past the times a run has",
              {"run/spans.json": _spans([("-1e308", "1e308")])}),
        Probe("an edited checkpoint", [*PYTHON, RESUME, "{dir}/run"], 1,
              "changed since the run was checkpointed", setup=_checkpointed),
        Probe("a seed of 2^64", _testbed(
            "simulate", str(TWO_DC), "--seed", str(2**64), "--out", "{dir}/o"), 2,
            "--seed: must be at most 4,294,967,295"),
        Probe("a negative Ray port", _testbed(*SWEEP, "--ray", "127.0.0.1:-5", "--out",
                                              "{dir}/o"), 2, "--ray: expected HOST:PORT",
              seconds=30),
        Probe("an empty Ray address", _testbed(*SWEEP, "--ray", ":", "--out", "{dir}/o"), 2,
              "--ray: expected HOST:PORT", seconds=30),
        Probe("a NaN in a sweep's saved points", _testbed(*SWEEP, "--out", "{dir}/sweep"), 0,
              "not taken, it runs again", setup=_swept(_nan_row), seconds=300),
        Probe("a FIFO for a sweep's saved points", _testbed(*SWEEP, "--out", "{dir}/sweep"), 2,
              "is a pipe: expected a file", setup=_swept(_fifo), seconds=300),
        Probe("a plugin whose summary exits", _testbed("plugins", "--json"), 0,
              '"status": "broken: SystemExit: 0 (at ', setup=_hostile_plugins,
              path="{dir}/site", stdout=True, seconds=120),
        Probe("a BaseException of a plugin's own", _testbed(
            "plan", str(TWO_DC), "-p", "raises-its-own"), 1,
            "failed while planning: Escape: out of here", setup=_hostile_plugins,
            path="{dir}/site", seconds=120),
        Probe("the suggested dilation", [*PYTHON, SUGGESTED], 0,
              "try --dilation 64, the most allowed", stdout=True),
        Probe("recovery of 1e300 s", _testbed(
            "simulate", str(TWO_DC), "--scenario", "{dir}/s.yaml", "--on-failure", "restart",
            "--out", "{dir}/o"), 2, "recovery.restart: must be from 0s to 86400s",
            {"s.yaml": "failures: [{at: 1ms, worker: east-1, back: 1s}]\n"
                       "recovery: {restart: 1e300s}\n"}),
        Probe("iterations -3 in results.json", _testbed(
            "results", "validate", "{dir}/run/results.json"), 2,
            "iterations: must be at least 0, got int -3", setup=_simulated),
    ]


def _said(probe: Probe, done: subprocess.CompletedProcess[str]) -> str:
    """The line the probe's answer is judged by (for a run that goes on after a note, the
    note's line)."""
    text = done.stdout if probe.stdout else done.stderr
    lines = [line for line in text.splitlines() if line.strip()]
    if probe.code == 0:
        return next((line for line in lines if probe.says in line), "")
    return lines[-1] if lines else ""


def run_probes(probes: list[Probe], out: Path) -> dict[str, Any]:
    """Each probe in a folder of its own under `out`: the failures, and each probe's wall
    time."""
    failures, seconds = [], {}
    for number, probe in enumerate(probes):
        folder = out / f"probe-{number}"
        folder.mkdir(parents=True, exist_ok=True)
        for name, content in probe.files.items():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(content)
        if probe.setup is not None:
            probe.setup(folder)
        command = [part.replace("{dir}", str(folder)) for part in probe.command]
        env = dict(os.environ)
        if probe.path is not None:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [
                probe.path.replace("{dir}", str(folder)), env.get("PYTHONPATH")]))
        started = time.monotonic()
        try:
            done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                                  timeout=probe.seconds, env=env)
        except subprocess.TimeoutExpired:
            failures.append(f"{probe.name}: no answer within {probe.seconds:g} s")
            continue
        seconds[probe.name] = round(time.monotonic() - started, 2)
        said = _said(probe, done)
        errors = [line for line in done.stderr.splitlines() if line.startswith("testbed: ")]
        if done.returncode != probe.code or probe.says not in said \
                or "Traceback" in done.stderr or len(errors) > 1:
            failures.append(f"{probe.name}: exit {done.returncode} (expected {probe.code}): "
                            f"{(done.stderr or done.stdout).strip()[-300:]}")
        print(f"probe {probe.name}: exit {done.returncode} in {seconds[probe.name]} s",
              flush=True)
    return {"cases": len(probes), "failures": len(failures), "details": failures,
            "seconds": seconds}
