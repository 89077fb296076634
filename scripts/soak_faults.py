"""Soak cases for faults a live run must survive or report: strangers dialling the workers,
`down` racing `up`, a killed delay line, SIGTERM to the workers. Used by scripts/soak.py."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
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
    from testbed.net.state import all_states

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
from testbed.runtime.wire.protocol import pack_hello
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
