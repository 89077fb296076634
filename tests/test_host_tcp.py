"""A plan's host TCP settings: carried by the plan (CSV and results), applied to the hosts
of the DCs it uses and only those, and honoured by the simulator."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.experiments.run import run
from testbed.plan.host_tcp import hosts_as_planned, tuned
from testbed.plan.model import HostTcp
from testbed.plan.text import parse_plan_csv, plan_to_csv
from testbed.policy import training_policy
from testbed.run.spec import RunSpec
from testbed.sim.simulate import simulate_plan

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "topologies" / "paper-3dc.yaml"


def test_plans_carry_their_host_settings_through_csv_and_results() -> None:
    inputs = load_inputs(PAPER, sets=("dp=4", "pp=3"))
    plan = plan_with_simulator(training_policy("atlas"), inputs.topology, inputs.job)
    assert plan.host_tcp == HostTcp(slow_start_after_idle=False)
    wanted = replace(plan, host_tcp=HostTcp(False, 8 << 20))
    assert parse_plan_csv(plan_to_csv(wanted)).host_tcp == wanted.host_tcp
    assert wanted.summary()["host_tcp"] == {"slow_start_after_idle": False,
                                            "buffer_bytes": 8 << 20}
    with pytest.raises(Exception, match="unknown tcp key 'nagle'"):
        parse_plan_csv(plan_to_csv(plan) + "tcp,nagle,off\n")


def test_settings_apply_to_the_dcs_the_plan_uses_and_no_other() -> None:
    inputs = load_inputs(PAPER, sets=("dp=1", "pp=4"))  # east alone, in file order
    plan = plan_with_simulator(training_policy("gpipe"), inputs.topology, inputs.job)
    plan = replace(plan, host_tcp=HostTcp(slow_start_after_idle=False, buffer_bytes=1 << 20))
    used = {inputs.topology.dc_of(g) for g in plan.used_gpus()}
    assert used == {"east"}
    tuned_topology = hosts_as_planned(inputs.topology, plan)
    for dc in inputs.topology.datacenters:
        tcp = tuned_topology.tcp_for(dc.name)
        if dc.name in used:
            assert not tcp.slow_start_after_idle and tcp.window_bytes == 1 << 20
            assert tcp.rmem[0] <= tcp.rmem[1] <= tcp.rmem[2]
        else:
            assert tcp == inputs.topology.tcp_for(dc.name)
    assert hosts_as_planned(inputs.topology, replace(plan, host_tcp=HostTcp())) \
        is inputs.topology
    assert tuned(inputs.topology.tcp, HostTcp()) == inputs.topology.tcp


def test_warm_windows_keep_temporal_sharing_from_restarting_in_slow_start() -> None:
    """With slow start after idle on, each turn on the link starts from the initial
    window; the simulator models it, so keeping windows warm cannot be slower."""
    inputs = load_inputs(PAPER, sets=("dp=4", "pp=3", "iterations=3"))
    seconds = {}
    for warm in ("on", "off"):
        policy = training_policy("atlas", {"warm": warm})
        plan = plan_with_simulator(policy, inputs.topology, inputs.job)
        summary, _ = simulate_plan(inputs.topology, inputs.job, plan, policy)
        seconds[warm] = summary.median_s
    assert seconds["on"] is not None and seconds["off"] is not None
    assert seconds["on"] < seconds["off"], seconds


def test_a_run_records_the_settings_it_ran_with(tmp_path: Path) -> None:
    inputs = load_inputs(PAPER, sets=("dp=4", "pp=3", "iterations=2"))
    result = run(RunSpec.build("simulate", inputs.topology, inputs.job, policy="atlas"), tmp_path)
    assert result.results["plan"]["host_tcp"] == {"slow_start_after_idle": False}
    ran = yaml.safe_load((tmp_path / "topology.yaml").read_text())
    for dc in ran["datacenters"]:
        assert dc["tcp"]["slow_start_after_idle"] is False
