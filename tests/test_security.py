"""Who may talk to a run: only its own workers, over a private local socket; nothing of
ours listens in the host's namespace; no shell anywhere. Needs root (CI runs as root)."""

from __future__ import annotations

import asyncio
import json
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.emulator.runtime.wire.protocol import read_message, send_message

ROOT = Path(__file__).resolve().parent.parent
TWO_DC = ROOT / "topologies" / "two-dc.yaml"
STATE = Path("/run/testbed")


def _listeners() -> set[str]:
    """TCP and UDP sockets listening in this (the host's) namespace."""
    out = subprocess.run(["ss", "-H", "-ltnu"], capture_output=True, text=True, check=True)
    return {" ".join(line.split()[4:5]) for line in out.stdout.splitlines()}


async def _knock(socket_path: Path, message: dict[str, object] | bytes) -> bool:
    """Connect and say something; True if the coordinator hung up on us."""
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    try:
        if isinstance(message, bytes):
            writer.write(message)
            await writer.drain()
        else:
            await send_message(writer, message)
        await asyncio.wait_for(read_message(reader), 15)
    except (asyncio.IncompleteReadError, ConnectionError):
        return True
    finally:
        writer.close()
    return False


@pytest.mark.root
@pytest.mark.usefixtures("clean_host")
def test_only_this_runs_workers_get_in(tmp_path: Path) -> None:
    before = set(STATE.glob("*.json")) if STATE.exists() else set()
    listening = _listeners()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from testbed.cli.main import main; main()", "up", str(TWO_DC),
         "-p", "gpipe", "--compute", "emulated", "--iterations", "40",
         "--out", str(tmp_path / "run")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        sockets: list[Path] = []
        while time.monotonic() < deadline and not sockets:
            states = set(STATE.glob("*.json")) - before if STATE.exists() else set()
            sockets = [p.with_suffix("") / "control.sock" for p in states
                       if (p.with_suffix("") / "control.sock").exists()]
            time.sleep(0.05)
        assert sockets, "the run's control socket never appeared"
        control = sockets[0]
        # while the workers are still starting: wrong secret, garbage, a huge length
        assert asyncio.run(_knock(control, {"op": "hello", "gpu": "east-0", "token": "0" * 64}))
        assert asyncio.run(_knock(control, b"GET / HTTP/1.0\r\n\r\n"))
        assert asyncio.run(_knock(control, b"\xff\xff\xff\xff" + b"x" * 64))
        assert stat.S_IMODE(control.stat().st_mode) == 0o600
        assert stat.S_IMODE(control.parent.stat().st_mode) == 0o700
        state_file = control.parent.with_suffix(".json")
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        assert _listeners() == listening  # workers listen only inside their namespaces
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("iteration 2/"):
                break
        # once every worker has joined, nobody else gets in, secret or not
        assert asyncio.run(_knock(control, {"op": "hello", "gpu": "east-0", "token": "x"}))
        assert _listeners() == listening
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=60)
    assert proc.returncode == 0, err  # the intruders did not disturb the run
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["status"] == "ok" and results["iterations"] == 40
    assert stat.S_IMODE((tmp_path / "run" / "results.json").stat().st_mode) == 0o644


def test_no_shell_anywhere() -> None:
    """Names and commands from topology files reach processes as argument lists only."""
    pattern = re.compile(r"shell\s*=\s*True|os\.system\(|os\.popen\(|create_subprocess_shell")
    offenders = [f"{path.relative_to(ROOT)}:{n}"
                 for folder in ("testbed", "plugins", "scripts")
                 for path in (ROOT / folder).rglob("*.py")
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if pattern.search(line)]
    assert not offenders


@pytest.mark.parametrize("name", ["plugins.baselines.pipeline:GPipePolicy", "os:system",
                                  str(ROOT / "plugins" / "baselines" / "pipeline.py")])
def test_policies_load_only_from_installed_entry_points(name: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", "from testbed.cli.main import main; main()", "plan", str(TWO_DC),
         "-p", name], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 2
    assert "unknown training policy" in result.stderr or "unknown policy" in result.stderr, \
        result.stderr


def _main(args: list[str]) -> int:
    from testbed.cli.main import main

    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_outputs_replace_links_and_never_write_through_them(tmp_path: Path) -> None:
    """As root, an output name in a results directory that is a link to another file
    must not overwrite that file: `report`, `profile`, `plan --csv`, logs, checkpoints."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    compare, sweep = tmp_path / "compare", tmp_path / "sweep"
    assert _main(["compare", str(TWO_DC), "-p", "gpipe", "-p", "1f1b", "--out",
                  str(compare)]) == 0
    run = compare / "runs" / "gpipe-r1"
    outputs = [compare / name for name in ("throughput.png", "gantt.png", "wan.png",
                                           "table.md")]
    outputs += [run / "profile.json", tmp_path / "plan.csv", sweep / "sweep.csv",
                sweep / "sweep.png", tmp_path / "worker.log", tmp_path / "r0-s0.pt"]
    sweep.mkdir()
    for path in outputs:
        path.unlink(missing_ok=True)
        path.symlink_to(victim)
    assert _main(["report", str(compare)]) == 0
    assert _main(["profile", str(run)]) == 0
    assert _main(["plan", str(TWO_DC), "-p", "gpipe", "--csv", str(tmp_path / "plan.csv")]) == 0
    assert _main(["sweep", str(TWO_DC), "-p", "gpipe", "--vary", "microbatches=4,8",
                  "--out", str(sweep), "--force"]) == 0
    assert victim.read_text() == "precious\n"
    from testbed.common.fsutil import open_fresh
    from testbed.run.checkpoint import save_stage

    with open_fresh(tmp_path / "worker.log") as log:
        log.write("a worker's output\n")
    save_stage(lambda path: Path(path).write_bytes(b"state"), tmp_path, 0, 0)
    assert victim.read_text() == "precious\n"
    for path in outputs:
        assert not path.is_symlink() and path.is_file() and path.stat().st_size > 0, path
