"""`testbed launch` end to end, as root: programs nobody here wrote for testbed (plain
sockets, torch's pipelining, DDP with a compression hook, torchrun) run unmodified over
the emulated WAN, measured from outside; and whatever ends a launch (a crashed rank, a hung
one, a lost host, Ctrl-C, `testbed down` after the launcher was killed) leaves no process
of it anywhere."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from testbed.metrics.link_counters import Counter, payload_between

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("clean_host")]
ROOT = Path(__file__).resolve().parent.parent
TWO_DC = str(ROOT / "topologies" / "two-dc.yaml")
EXAMPLES = ROOT / "examples" / "launch"
ONE_PER_DC = str(EXAMPLES / "one-per-dc.yaml")

SEND = """
import os, socket, time
rank, n = int(os.environ["RANK"]), int(os.environ["NBYTES"])
if rank == 0:
    server = socket.create_server(("0.0.0.0", 29600))
    conn, _ = server.accept()
    got = 0
    while chunk := conn.recv(1 << 20):
        got += len(chunk)
    print("received", got)
else:
    for _ in range(200):
        try:
            sock = socket.create_connection((os.environ["MASTER_ADDR"], 29600))
            break
        except OSError:
            time.sleep(0.05)
    sock.sendall(b"x" * n)
    sock.close()
"""

CRASH_AND_ESCAPE = """
import os, subprocess, sys, time
rank = int(os.environ["RANK"])
if rank == 1:
    time.sleep(1)
    sys.exit(3)
# a child in a session of its own, whose parent is gone: no process group holds it
pid = subprocess.Popen(["sh", "-c", "sleep 600 & echo $! > " + sys.argv[1] + "; wait"],
                       start_new_session=True).pid
time.sleep(600)
"""


def _launch(tmp_path: Path, program: str, *args: str, env: dict[str, str] | None = None,
            timeout: float = 180) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    script = tmp_path / "program.py"
    script.write_text(program)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-c", "from testbed.cli.main import main; main()", "launch", TWO_DC,
         "--out", str(out), *args, "--", sys.executable, str(script), str(tmp_path / "pid")],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
        check=False)
    return result, json.loads((out / "results.json").read_text())


def _rank_logs(out: Path, lines: int = 40) -> str:
    """The end of each rank's log: what an assertion on a launch shows beside its stderr."""
    return "".join(f"\n== {log.name}\n" + "\n".join(log.read_text().splitlines()[-lines:])
                   for log in sorted((out / "ranks").glob("*.log")))


def _counters(out: Path) -> dict[str, list[Counter]]:
    found: dict[str, list[Counter]] = {}
    with open(out / "counters.csv") as handle:
        for row in csv.DictReader(handle):
            found.setdefault(row["link"], []).append(
                Counter(float(row["time_s"]), int(row["bytes"]), int(row["packets"]),
                        int(row["drops"])))
    return found


def _gone(pid: int, wait_s: float = 5.0) -> bool:
    """Whether the process has ended (a zombie waiting for its reaper has), within
    `wait_s` (a SIGKILL takes effect as the process next runs)."""
    from testbed.emulator.net.state import process_state

    deadline = time.monotonic() + wait_s
    while process_state(pid) not in (None, "Z", "X"):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_the_bytes_a_program_sends_are_what_the_wan_reports(tmp_path: Path) -> None:
    sent = 20_000_000
    result, results = _launch(tmp_path, SEND, "-p", ONE_PER_DC, env={"NBYTES": str(sent)})
    assert result.returncode == 0, result.stderr
    assert results["status"] == "ok" and results["kind"] == "launch"
    links = {link["link"]: link for link in results["wan"]["links"]}
    # the payload, less headers, within 1%; the other way only ACKs (zero payload)
    assert links["west>east"]["bytes"] == pytest.approx(sent, rel=0.01)
    assert links["east>west"]["bytes"] < 0.01 * sent
    assert links["west>east"]["wire_bytes"] > sent
    assert 0 < links["west>east"]["peak_utilization"] <= 1.05
    assert results["wan"]["bytes"] == links["west>east"]["bytes"] + links["east>west"]["bytes"]
    ranks = results["outcomes"]
    assert [(r["host"], r["end"], r["exit_code"]) for r in ranks] == [
        ("east-0", "exited", 0), ("west-0", "exited", 0)]
    assert all(r["cpu_s"] is not None and r["cpu_s"] > 0 for r in ranks)
    assert f"received {sent}" in (tmp_path / "out" / ranks[0]["log"]).read_text()
    assert f"[0 east-0] received {sent}" in result.stdout
    for name in ("trace.json.gz", "wan.png", "counters.csv", "topology.yaml"):
        assert (tmp_path / "out" / name).exists(), name
    check = subprocess.run([sys.executable, "-c", "from testbed.cli.main import main; main()",
                            "results", "validate", str(tmp_path / "out")],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


def test_a_crashed_rank_ends_the_launch_and_nothing_it_started_is_left(
        tmp_path: Path) -> None:
    started = time.monotonic()
    result, results = _launch(tmp_path, CRASH_AND_ESCAPE, "-p", ONE_PER_DC, "--grace", "1")
    assert result.returncode == 1, result.stderr
    assert time.monotonic() - started < 60
    assert results["status"] == "failed"
    assert "rank-1 (west-0) exited with code 3" in results["error"]
    ends = [(r["end"], r["exit_code"]) for r in results["outcomes"]]
    assert ends[1] == ("exited", 3) and ends[0][0] == "stopped"
    escaped = int((tmp_path / "pid").read_text())
    assert _gone(escaped), "a process that left its rank's process group is still running"


def test_a_hung_program_is_stopped_at_the_timeout(tmp_path: Path) -> None:
    result, results = _launch(tmp_path, "import time\ntime.sleep(600)\n", "-p", ONE_PER_DC,
                              "--timeout", "2")
    assert result.returncode == 1
    assert results["status"] == "timed_out" and "--timeout 2 s" in results["error"]
    assert {r["end"] for r in results["outcomes"]} == {"timed_out"}
    assert all(r["wall_s"] < 10 for r in results["outcomes"])


def test_a_lost_host_is_killed_at_its_time_and_the_rest_go_on(tmp_path: Path) -> None:
    scenario = tmp_path / "scenario.yaml"
    trace = ROOT / "scenarios" / "wan-trace.csv"
    scenario.write_text("failures:\n  - {at: 1s, worker: west-1}\n"
                        "events:\n  - {at: 0.5s, link: [east, west], bandwidth: 100Mbit, "
                        f"for: 1s}}\ntraces:\n  - {{link: [west, east], csv: {trace}}}\n")
    program = "import os, time\ntime.sleep(3 if os.environ['RANK'] != '3' else 600)\n"
    result, results = _launch(tmp_path, program, "--scenario", str(scenario))
    assert result.returncode == 0, result.stderr
    assert results["status"] == "ok"
    ends = {r["host"]: (r["end"], r["signal"]) for r in results["outcomes"]}
    assert ends["west-1"] == ("lost", "SIGKILL")
    assert {ends[h] for h in ("east-0", "east-1", "west-0")} == {("exited", None)}
    lost = results["outcomes"][3]["wall_s"]
    assert 0.5 < lost < 2.0  # lost 1 s after the ranks began, this one a little later
    assert [e["applied"] for e in results["events"]] == [True]
    assert [f["applied"] for f in results["scenario"]["failures"]] == [True]
    assert results["scenario"]["traces"][0]["applied"]


def _started(out: Path, ranks: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        logs = list((out / "ranks").glob("*.log")) if (out / "ranks").exists() else []
        if len(logs) == ranks and all(log.stat().st_size for log in logs):
            return
        time.sleep(0.1)
    raise AssertionError("the ranks did not start")


def _background(tmp_path: Path, program: str) -> tuple[subprocess.Popen[str], Path]:
    script = tmp_path / "program.py"
    script.write_text(program)
    out = tmp_path / "out"
    launcher = subprocess.Popen(
        [sys.executable, "-c", "from testbed.cli.main import main; main()", "launch", TWO_DC,
         "-p", ONE_PER_DC, "--out", str(out), "--", sys.executable, str(script),
         str(tmp_path / "pid")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return launcher, out


HOLD = """
import subprocess, sys, time
subprocess.Popen(["sh", "-c", "sleep 600 & echo $! > " + sys.argv[1] + "; wait"],
                 start_new_session=True)
print("up", flush=True)
time.sleep(600)
"""


def test_ctrl_c_stops_every_rank_and_writes_the_results(tmp_path: Path) -> None:
    launcher, out = _background(tmp_path, HOLD)
    _started(out, 2)
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=60)
    assert launcher.returncode == 130, err
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "interrupted"
    assert {r["end"] for r in results["outcomes"]} == {"stopped"}
    assert _gone(int((tmp_path / "pid").read_text()))


def test_down_removes_what_a_killed_launcher_left(tmp_path: Path) -> None:
    launcher, out = _background(tmp_path, HOLD)
    _started(out, 2)
    time.sleep(0.5)
    escaped = int((tmp_path / "pid").read_text())
    launcher.kill()
    launcher.communicate(timeout=30)
    assert not _gone(escaped, wait_s=0)
    down = subprocess.run([sys.executable, "-c", "from testbed.cli.main import main; main()",
                           "down"], capture_output=True, text=True, timeout=120, check=False)
    assert down.returncode == 0, down.stderr
    assert _gone(escaped)


# --- programs nobody here wrote ------------------------------------------------------------

def _example(tmp_path: Path, name: str, *args: str, launch: tuple[str, ...] = (),
             timeout: float = 300, topology: str = TWO_DC
             ) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-c", "from testbed.cli.main import main; main()", "launch", topology,
         "--out", str(out), "-q", *launch, "--", sys.executable, str(EXAMPLES / name), *args],
        capture_output=True, text=True, timeout=timeout, check=False)
    assert (out / "results.json").exists(), result.stderr
    return result, json.loads((out / "results.json").read_text())


def test_torchs_pipelining_trains_across_the_wan(tmp_path: Path) -> None:
    result, results = _example(tmp_path, "pipeline.py", "--steps", "3")
    assert result.returncode == 0, result.stderr
    assert [r["exit_code"] for r in results["outcomes"]] == [0, 0, 0, 0]
    curve = results["loss_curve"]
    assert [p["iteration"] for p in curve] == [0, 1, 2]
    assert all(p["loss"] > 0 and p["tokens"] == 256 * (p["iteration"] + 1) for p in curve)
    # stage 1 (east-1) to stage 2 (west-0) and back: activations one way, gradients the
    # other, 4 microbatches of 2 x 32 x 64 fp32 a step each way
    links = {link["link"]: link["bytes"] for link in results["wan"]["links"]}
    activations = 3 * 4 * 2 * 32 * 64 * 4
    assert links["east>west"] >= activations and links["west>east"] >= activations
    assert (tmp_path / "out" / "loss.png").exists()


def test_ddp_all_reduce_bytes_per_step_are_the_compression_hooks_payload(
        tmp_path: Path) -> None:
    steps = 5
    result, results = _example(tmp_path, "ddp_fp16.py", "--steps", str(steps),
                               launch=("-p", ONE_PER_DC))
    assert result.returncode == 0, result.stderr
    points = results["metrics"]
    payload = next(p["values"]["hook_payload_bytes"] for p in points
                   if p["values"].get("hook_payload_bytes"))
    begin = max(p["time_s"] for p in points if p["values"].get("phase") == 0)
    end = min(p["time_s"] for p in points if p["values"].get("phase") == 1)
    header = 0 if results["shaper"] == "userspace" else 14
    # two ranks, one per DC: a ring all-reduce sends each the other's half to reduce and
    # its reduced half back, the whole payload each way per step
    for link, samples in _counters(tmp_path / "out").items():
        per_step = payload_between(samples, begin, end, header) / steps
        assert per_step == pytest.approx(payload, rel=0.02), link


def test_torchrun_per_host_restarts_a_failed_worker_group(tmp_path: Path) -> None:
    # east's restarted worker comes late, so that west's reads the store first: it must
    # not find east's previous attempt there
    program = """
import os, sys, time
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if restart == 1 and os.environ["TESTBED_DC"] == "east":
    time.sleep(3)
import torch.distributed as dist
dist.init_process_group("gloo")
print("rank", dist.get_rank(), "of", dist.get_world_size(), "restart", restart, flush=True)
time.sleep(1)
if restart == 0 and os.environ["TESTBED_DC"] == "west":
    sys.exit(5)
dist.barrier()
time.sleep(2)  # seen by the launch's sampler (every 0.5 s) at least once
"""
    result, results = _launch(tmp_path, program, "-p", ONE_PER_DC, "--torchrun",
                              "--max-restarts", "1")
    assert result.returncode == 0, result.stderr + _rank_logs(tmp_path / "out")
    outcomes = {o["dc"]: o for o in results["outcomes"]}
    logs = _rank_logs(tmp_path / "out")
    assert [o["exit_code"] for o in outcomes.values()] == [0, 0], logs
    # west's agent counts its failed group; east's restarts either for its own group's
    # failure (counted) or for west rejoining the rendezvous first, which torch's agent
    # does not count as a retry
    assert outcomes["west"]["restarts"] == 1, logs
    assert outcomes["east"]["restarts"] in (0, 1), logs
    for log in (tmp_path / "out" / "ranks").glob("*.log"):
        assert log.read_text().count(" of 2 restart ") == 2, logs
    assert sorted(r for o in outcomes.values() for r in o["torch_ranks"]) == [0, 1]


def test_one_torchrun_per_dc_reads_its_arguments_from_the_environment(
        tmp_path: Path) -> None:
    program = """
import os
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
print("rank", dist.get_rank(), os.environ["LOCAL_RANK"], os.environ["TESTBED_DC"], flush=True)
"""
    script = tmp_path / "program.py"
    script.write_text(program)
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-c", "from testbed.cli.main import main; main()", "launch", TWO_DC,
         "--per", "dc", "--out", str(out), "--", sys.executable, "-m", "torch.distributed.run",
         str(script)], capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    assert [(o["host"], o["gpus"], o["torch_ranks"]) for o in results["outcomes"]] == [
        ("east-0", ["east-0", "east-1"], [0, 1]), ("west-0", ["west-0", "west-1"], [2, 3])]


def _torchft() -> None:
    try:
        import torchft  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"torchft 0.2.0 is not importable here: {exc} (pip install "
                    "torchft==0.2.0 --no-deps, and the OpenTelemetry packages it imports at "
                    "import time: opentelemetry-sdk, opentelemetry-exporter-otlp-proto-http)")


def _syncs(results: dict[str, Any], rank: int) -> list[tuple[float, float]]:
    """(begin, end) of each sync, as rank `rank` reported them."""
    begins = [p["time_s"] for p in results["metrics"]
              if p["rank"] == rank and "sync_begin" in p["values"]]
    ends = [p["time_s"] for p in results["metrics"]
            if p["rank"] == rank and "sync_end" in p["values"]]
    return list(zip(begins, ends, strict=False))


def test_torchft_diloco_moves_its_payload_per_sync_across_the_wan(tmp_path: Path) -> None:
    _torchft()
    # the first sync also forms the quorum and heals; the two after it are each checked
    result, results = _example(tmp_path, "torchft_diloco.py", "--syncs", "3",
                               launch=("-p", ONE_PER_DC, "--timeout", "150"))
    assert result.returncode == 0, result.stderr
    payload = next(p["values"]["payload_bytes"] for p in results["metrics"]
                   if "payload_bytes" in p["values"])
    participants = [p["values"]["participants"] for p in results["metrics"]
                    if "participants" in p["values"]]
    assert participants and set(participants) == {2}
    header = 0 if results["shaper"] == "userspace" else 14
    counters = _counters(tmp_path / "out")
    # the first sync also forms the quorum and heals the newcomer from the other group;
    # a sync begins when the first group has begun it (its half of the ring may leave
    # before the other group is there) and ends when the last has ended it
    windows = [(min(a[0], b[0]), max(a[1], b[1]))
               for a, b in zip(_syncs(results, 0), _syncs(results, 1), strict=True)]
    assert len(windows) == 3
    for begin, end in windows[1:]:
        for link, samples in counters.items():
            moved = payload_between(samples, begin, end, header)
            assert moved == pytest.approx(payload, rel=0.02), (link, begin)


@pytest.mark.benchmark  # the two-DC test's at another size
def test_torchft_diloco_across_three_dcs(tmp_path: Path) -> None:
    _torchft()
    ranks = tmp_path / "ranks.yaml"
    ranks.write_text("[east-0, central-0, west-0]\n")
    result, results = _example(tmp_path, "torchft_diloco.py", "--syncs", "3",
                               launch=("-p", str(ranks), "--timeout", "150"),
                               topology=str(ROOT / "topologies" / "paper-3dc.yaml"))
    assert result.returncode == 0, result.stderr
    participants = {p["values"]["participants"] for p in results["metrics"]
                    if "participants" in p["values"]}
    assert participants == {3}
    assert all(link["bytes"] > 0 for link in results["wan"]["links"])


@pytest.mark.benchmark  # a minute of torchft; a trace and a lost host: the test above
def test_torchft_diloco_goes_on_under_a_wan_trace_and_without_a_lost_group(
        tmp_path: Path) -> None:
    _torchft()
    scenario = tmp_path / "scenario.yaml"
    trace = ROOT / "scenarios" / "wan-trace.csv"
    scenario.write_text(f"traces:\n  - {{link: [east, west], csv: {trace}}}\n"
                        "failures:\n  - {at: 25s, worker: west-0}\n")
    result, results = _example(tmp_path, "torchft_diloco.py", "--syncs", "30",
                               launch=("-p", ONE_PER_DC, "--scenario", str(scenario),
                                       "--timeout", "150"))
    assert result.returncode == 0, result.stderr
    ends = {o["host"]: (o["end"], o["exit_code"]) for o in results["outcomes"]}
    assert ends == {"east-0": ("exited", 0), "west-0": ("lost", -9)}
    syncs = [p["values"]["participants"] for p in results["metrics"]
             if p["rank"] == 0 and "participants" in p["values"]]
    assert len(syncs) >= 30 and syncs[0] == 2 and syncs[-1] == 1
    assert results["scenario"]["traces"][0]["applied"]


def test_across_two_machines_each_starts_the_ranks_of_its_own_dcs(tmp_path: Path) -> None:
    """Two "machines" (namespaces on a bridge, testbed.emulator.net.namespace_cluster), each running
    the same launch command: west-0's bytes cross the VXLAN tunnel to rank 0 on m1, and
    m2, whose rank is done first, holds its share until m1's rank has them all."""
    from testbed.emulator.net.layout import build_layout
    from testbed.emulator.net.namespace_cluster import namespace_machines
    from testbed.emulator.net.slots import free_slot
    from testbed.topology import load_topology

    from .conftest import machine_prefix

    sent = 5_000_000
    script = tmp_path / "program.py"
    script.write_text(SEND)
    topology = load_topology(Path(TWO_DC))
    slot = free_slot(lambda s: build_layout(topology, s))
    secret = tmp_path / "secret"
    secret.write_text("s3cret-" * 8)
    secret.chmod(0o600)
    with namespace_machines(["m1", "m2"], prefix=machine_prefix()) as made:
        cluster = tmp_path / "cluster.yaml"
        cluster.write_text(json.dumps({"slot": slot, "secret": "secret", "machines": [
            {"name": "m1", "address": made[0].address, "netns": made[0].netns,
             "dcs": ["east"]},
            {"name": "m2", "address": made[1].address, "netns": made[1].netns,
             "dcs": ["west"]}]}))
        launchers = [subprocess.Popen(
            [sys.executable, "-c", "from testbed.cli.main import main; main()", "launch",
             TWO_DC, "-p", ONE_PER_DC, "--cluster", str(cluster), "--machine", name,
             "--out", str(tmp_path / name), "-q", "--", sys.executable, str(script)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "NBYTES": str(sent)}) for name in ("m1", "m2")]
        try:
            outputs = [launcher.communicate(timeout=90) for launcher in launchers]
        finally:
            for launcher in launchers:  # a launch stopped so removes its share
                if launcher.poll() is None:
                    launcher.terminate()
                    launcher.communicate(timeout=30)
    logs = {p.name: p.read_text() for p in tmp_path.glob("m*/ranks/*.log")}
    for launcher, (_, err) in zip(launchers, outputs, strict=True):
        assert launcher.returncode == 0, (err, logs)
    m1, m2 = (json.loads((tmp_path / name / "results.json").read_text())
              for name in ("m1", "m2"))
    assert [o["host"] for o in m1["outcomes"]] == ["east-0"]
    assert [o["host"] for o in m2["outcomes"]] == ["west-0"]
    assert m1["master"] == m2["master"]
    assert [link["link"] for link in m2["wan"]["links"]] == ["west>east"]
    assert m2["wan"]["links"][0]["bytes"] == pytest.approx(sent, rel=0.01)
    assert m2["cluster"] == {"name": m2["cluster"]["name"], "machine": "m2"}
    assert m1["cluster"]["machines"] == {"m2": "ok"}
    assert f"received {sent}" in (tmp_path / "m1" / "ranks" / "rank-0.log").read_text()
