"""`testbed launch`'s pure parts: seats and the environment torch expects, rank order,
the program's metric lines and its loss curve, link counters, the results' schema, and
what is refused before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.emulator.runtime.launch.metric_lines import (
    launch_loss_curve,
    metric_in_output,
    parse_metric,
)
from testbed.emulator.runtime.launch.placement import file_order, order_from_file, rank_order
from testbed.emulator.runtime.launch.ranks import Rendezvous, seat_env, seats, torchrun_argv
from testbed.emulator.runtime.launch.spec import LaunchSpec, refuse_dilation
from testbed.errors import InputError
from testbed.experiments.planning import plan_with_simulator
from testbed.metrics.link_counters import (
    Counter,
    direction_use,
    payload,
    payload_between,
    total_utilization,
)
from testbed.report.results_schema import LAUNCH_KIND, results_problems, shipped_schema
from testbed.topology import load_topology

from .conftest import TOPOLOGIES
from .test_plugins import run_testbed

TWO_DC = load_topology(TOPOLOGIES / "two-dc.yaml")


def test_one_rank_per_host_gets_the_environment_torch_expects() -> None:
    order = ["west-1", "east-0", "west-0"]
    world = seats(order, TWO_DC, "host")
    meet = Rendezvous("10.64.0.13")
    env = [seat_env(s, world, meet, "host", f"/m{s.index}") for s in world]
    assert [e["RANK"] for e in env] == ["0", "1", "2"]
    assert [e["WORLD_SIZE"] for e in env] == ["3"] * 3
    assert [(e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"]) for e in env] == [
        ("0", "2"), ("0", "1"), ("1", "2")]
    assert {e["MASTER_ADDR"] for e in env} == {"10.64.0.13"}
    assert {e["MASTER_PORT"] for e in env} == {"29500"}
    assert [(e["TESTBED_DC"], e["TESTBED_GPU"]) for e in env] == [
        ("west", "west-1"), ("east", "east-0"), ("west", "west-0")]
    assert env[2]["TESTBED_METRICS"] == "/m2"


def test_one_process_per_dc_is_torchruns_node_with_its_arguments_as_variables() -> None:
    world = seats(file_order(TWO_DC), TWO_DC, "dc")
    assert [(s.index, s.host, s.gpus) for s in world] == [
        (0, "east-0", ("east-0", "east-1")), (1, "west-0", ("west-0", "west-1"))]
    env = seat_env(world[1], world, Rendezvous("10.64.0.10", 29501), "dc", "/m")
    assert (env["PET_NNODES"], env["PET_NODE_RANK"], env["PET_NPROC_PER_NODE"]) == \
        ("2", "1", "2")
    assert (env["PET_MASTER_ADDR"], env["PET_MASTER_PORT"]) == ("10.64.0.10", "29501")
    assert "RANK" not in env


def test_torchrun_per_host_meets_at_rank_zero_and_runs_the_command_as_it_is() -> None:
    world = seats(["east-0", "west-0"], TWO_DC, "host")
    meet = Rendezvous("10.64.0.10", run_id="testbed-x")
    first = torchrun_argv(world[0], world, meet, "10.64.0.10", 2, "py")
    second = torchrun_argv(world[1], world, meet, "10.64.1.10", 2, "py")
    assert first[:3] == ["py", "-m", "torch.distributed.run"]
    assert "10.64.0.10:29400" in first and "is_host=1" in first and "is_host=0" in second
    assert second[second.index("--local-addr") + 1] == "10.64.1.10"
    assert second[second.index("--max-restarts") + 1] == "2"
    assert second[-1] == "--no-python"


def test_rank_order_from_the_file_a_policy_or_a_list(tmp_path: Path) -> None:
    from testbed.experiments.inputs import load_inputs

    assert file_order(TWO_DC) == ["east-0", "east-1", "west-0", "west-1"]
    inputs = load_inputs(TOPOLOGIES / "two-dc.yaml")
    atlas = rank_order(inputs.topology, inputs.job, "atlas", {}, plan_with_simulator)
    from testbed.policy import training_policy

    plan = plan_with_simulator(training_policy("atlas"), inputs.topology, inputs.job)
    assert atlas == plan.used_gpus()
    assert atlas[:plan.pp] == [plan.lead_gpu(0, stage) for stage in range(plan.pp)]
    listed = tmp_path / "ranks.yaml"
    listed.write_text("- west-1\n- east-0\n")
    assert rank_order(TWO_DC, inputs.job, str(listed), {}, plan_with_simulator) == [
        "west-1", "east-0"]


@pytest.mark.parametrize(("text", "key", "problem"), [
    ("- east-0\n- east-0\n", "[1]", "listed twice"),
    ("- east-9\n", "[0]", "no GPU host 'east-9'"),
    ("[1, 2]\n", "[0]", "expected a GPU host"),
    ("east-0: 1\n", None, "expected a list"),
])
def test_a_bad_rank_file_is_one_located_line(tmp_path: Path, text: str, key: str | None,
                                             problem: str) -> None:
    path = tmp_path / "ranks.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        order_from_file(path, TWO_DC)
    assert caught.value.source == str(path) and caught.value.key == key
    assert problem in caught.value.problem


def test_metric_lines_are_read_from_output_and_files() -> None:
    line = 'TESTBED_METRIC {"step": 3, "loss": 2.5, "tokens": 64, "note": "x", "time": 110.5}'
    point = metric_in_output(line, 2, 9.0, epoch=100.0)
    assert point == {"rank": 2, "time_s": 10.5, "step": 3,
                     "values": {"loss": 2.5, "tokens": 64.0}}
    assert metric_in_output("loss 2.5", 0, 1.0, 0.0) is None
    assert parse_metric('{"loss": NaN}', 0, 1.0, 0.0) == {
        "rank": 0, "time_s": 1.0, "step": None, "values": {"loss": None}}
    for bad in ("[1, 2]", "{", '{"name": "x"}', '{"step": true, "ok": true}'):
        assert parse_metric(bad, 0, 1.0, 0.0) is None, bad


def test_the_loss_curve_is_the_mean_of_each_step_when_the_last_rank_said_it() -> None:
    points = [parse_metric(text, rank, t, 0.0) for text, rank, t in (
        ('{"step": 0, "loss": 4.0, "tokens": 10}', 0, 1.0),
        ('{"step": 0, "loss": 2.0, "tokens": 10}', 1, 1.5),
        ('{"step": 1, "loss": 1.0, "tokens": 10}', 0, 2.5),
        ('{"step": 1, "step_s": 0.3}', 1, 2.0))]
    curve = launch_loss_curve([p for p in points if p is not None])
    assert curve == [{"iteration": 0, "time_s": 1.5, "tokens": 20, "loss": 3.0},
                     {"iteration": 1, "time_s": 2.5, "tokens": 30, "loss": 1.0}]
    assert launch_loss_curve([]) is None


def test_link_counters_become_payload_rates_and_utilization() -> None:
    samples = [Counter(0.0, 1000, 10, 0), Counter(1.0, 1000, 10, 0),
               Counter(2.0, 1000 + 1_000_000 + 700 * 52, 1010, 3),
               Counter(3.0, 1000 + 1_000_000 + 700 * 52, 1010, 3)]
    use = direction_use("east>west", samples, 1e7)
    assert use.wire_bytes == 1_000_000 + 700 * 52 and use.packets == 1000
    assert use.payload_bytes == 1_000_000 + 700 * 52 - 1000 * 52
    assert use.drops == 3 and use.bps == [0.0, use.wire_bytes * 8.0, 0.0]
    assert use.peak_utilization() == pytest.approx(use.wire_bytes * 8 / 1e7)
    assert use.mean_utilization(3.0) == pytest.approx(use.wire_bytes * 8 / 3e7)
    assert total_utilization([use], 3.0) == pytest.approx(use.mean_utilization(3.0))
    # idle before and after: the bytes between two moments are exact
    assert payload_between(samples, 0.5, 2.5) == use.payload_bytes
    assert payload(100, 5, 14) == 0


def test_dilation_and_what_a_launch_cannot_do_are_refused(tmp_path: Path) -> None:
    refuse_dilation("1")
    with pytest.raises(InputError, match="different experiment"):
        refuse_dilation("4")
    spec = LaunchSpec(TWO_DC, (), ("east-0",), "file", tmp_path)
    with pytest.raises(InputError, match="give the program after"):
        spec.check()
    with pytest.raises(InputError, match="--torchrun"):
        LaunchSpec(TWO_DC, ("x",), ("east-0",), "file", tmp_path, per="dc",
                   torchrun=True).check()


def test_the_cli_refuses_dilation_in_one_line_before_anything_starts() -> None:
    result = run_testbed(["launch", str(TOPOLOGIES / "two-dc.yaml"), "--dilation", "4",
                          "--", "true"], None)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--dilation" in lines[0] and "different experiment" in lines[0]


def _launch_results() -> dict[str, object]:
    return {
        "schema_version": 1, "kind": "launch", "topology": "two-dc",
        "command": ["python", "train.py"], "per": "host", "torchrun": False,
        "placement": "file", "hosts": ["east-0", "west-0"], "master": "10.64.0.10:29500",
        "shaper": "netem", "status": "ok", "error": None, "wall_s": 3.5,
        "clock": {"compute": "c", "network": "n", "dilation": 1},
        "wan": {"bytes": 10, "wire_bytes": 100, "utilization": 0.1, "peak_utilization": 0.2,
                "sample_s": 0.2, "links": [
                    {"link": "east>west", "rate_bps": 1e9, "bytes": 10, "wire_bytes": 100,
                     "packets": 2, "drops": 0, "peak_bps": 1e6, "peak_utilization": 0.001,
                     "mean_utilization": 0.0001}], "counters_error": None},
        "outcomes": [{"rank": 0, "host": "east-0", "dc": "east", "gpus": ["east-0"],
                      "end": "exited", "exit_code": 0, "signal": None, "wall_s": 3.4,
                      "cpu_s": 1.2, "peak_memory_bytes": 1000, "log": "ranks/rank-0.log"}],
        "metrics": [{"rank": 0, "time_s": 1.0, "step": 0, "values": {"loss": 2.0}}],
        "loss_curve": [{"iteration": 0, "time_s": 1.0, "tokens": 0, "loss": 2.0}],
        "time_to_loss": None, "events": [], "scenario": None,
        "versions": {"testbed": "0", "torch": "0", "python": "0", "kernel": "0"}}


def test_a_launchs_results_are_their_own_kind_and_validate() -> None:
    good = _launch_results()
    assert results_problems(good, "r.json") == []
    assert shipped_schema(LAUNCH_KIND)["properties"]["kind"] == {"enum": ["launch"]}
    bad = json.loads(json.dumps(good))
    bad["outcomes"][0]["end"] = "vanished"
    del bad["wan"]["wire_bytes"]
    problems = [str(p) for p in results_problems(bad, "r.json")]
    assert any("outcomes[0].end" in p for p in problems), problems
    assert any("wan.wire_bytes: missing" in p for p in problems), problems
    assert "launch's results of 1" in str(results_problems({**good, "schema_version": 9},
                                                          "r.json")[0])


def test_the_shipped_launch_schema_is_the_types() -> None:
    from testbed.report.results_schema import schema_text

    shipped = (Path(__file__).resolve().parent.parent / "testbed" / "report" /
               "launch.schema.json").read_text()
    assert shipped == schema_text(LAUNCH_KIND)


def test_results_validate_takes_a_launch_directory(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps(_launch_results()))
    result = run_testbed(["results", "validate", str(tmp_path)], None)
    assert result.returncode == 0, result.stderr


def test_show_prints_a_launch_again_and_draws_its_plots(tmp_path: Path) -> None:
    (tmp_path / "results.json").write_text(json.dumps(_launch_results()))
    (tmp_path / "counters.csv").write_text(
        "time_s,link,bytes,packets,drops\n0.0,east>west,0,0,0\n0.2,east>west,25000000,"
        "17000,0\n0.4,east>west,25000000,17000,0\n")
    result = run_testbed(["show", str(tmp_path), "--out", str(tmp_path / "plots")], None)
    assert result.returncode == 0, result.stderr
    assert "rank 0 east-0: exited exit 0, 3.4 s, 1.2 s CPU" in result.stdout
    assert "status ok" in result.stdout
    assert (tmp_path / "plots" / "wan.png").exists()
    assert (tmp_path / "plots" / "loss.png").exists()
    rows = (tmp_path / "plots" / "wan.csv").read_text().splitlines()
    assert rows[1].split(",")[-1] == "1.0"  # 25 MB in 0.2 s: the whole 1 Gbit/s


def test_the_cgroup2_mount_is_found_in_mountinfo(tmp_path: Path) -> None:
    from testbed.emulator.net.sweep import cgroup2_mount

    group = tmp_path / "unified"
    group.mkdir()
    (group / "cgroup.procs").write_text("")
    info = tmp_path / "mountinfo"
    info.write_text("30 23 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
                    f"41 31 0:38 / {group} rw,relatime - cgroup2 cgroup2 rw\n")
    assert cgroup2_mount(info) == group
    info.write_text("30 23 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n")
    assert cgroup2_mount(info) is None


def test_a_process_tree_is_found_below_its_first_process() -> None:
    import subprocess
    import sys

    from testbed.emulator.net.sweep import descendants

    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               "subprocess.Popen(['sleep', '30']); time.sleep(30)"])
    try:
        import time

        deadline = time.monotonic() + 10
        while len(descendants(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        found = descendants(parent.pid)
        assert found[0] == parent.pid and len(found) == 2
    finally:
        for pid in reversed(descendants(parent.pid)):
            subprocess.run(["kill", "-9", str(pid)], check=False)
        parent.wait()


def test_the_launch_environment_keeps_what_the_user_set() -> None:
    from testbed.emulator.runtime.launch.ranks import launch_env

    env = launch_env({"OMP_NUM_THREADS": "4", "PATH": "/bin"})
    assert env["OMP_NUM_THREADS"] == "4" and env["PATH"] == "/bin"
    assert env["PYTHONUNBUFFERED"] == "1" and env["GLOO_SOCKET_IFNAME"] == "eth0"
    assert launch_env({"GLOO_SOCKET_IFNAME": "lo"})["GLOO_SOCKET_IFNAME"] == "lo"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert launch_env({"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0"})[
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "0"
