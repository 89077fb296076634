"""The model's WAN pairs at a run's end, as results.json records them beside the emulator's
sockets (`wan_connections`): where each pair's slow starts now stop."""

from __future__ import annotations

import json
import math
from pathlib import Path

from click.testing import CliRunner

from testbed.cli.main import main
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.plan.tcp_model import MSS
from testbed.policy import training_policy
from testbed.sim.flows import pair_between
from testbed.sim.loss_cycles import LossCycle
from testbed.sim.pair_states import PairState, pair_states
from testbed.sim.simulator import Simulator

ROOT = Path(__file__).resolve().parent.parent
DETOUR = ROOT / "scripts" / "fidelity_topologies" / "detour-3dc.yaml"


def test_a_clean_pair_is_one_row_for_its_connections_a_lossy_one_a_row_each() -> None:
    topology = load_inputs(ROOT / "topologies" / "two-dc.yaml").topology
    clean = pair_between(topology, "east", "west", 4, 0.04, 1e9)
    clean.cwnd, clean.ssthresh = 600 * MSS, 420 * MSS
    lossy = pair_between(topology, "west", "east", 2, 0.04, 1e9, loss=0.001)
    lossy.cycles = [LossCycle(cwnd=100 * MSS, first=1.0, ssthresh=70 * MSS),
                    LossCycle(cwnd=300 * MSS, first=1.0)]
    inside = pair_between(topology, "east", "east", 1, 0.0001, 1e9)
    states = pair_states({("east-0", "west-0"): clean, ("west-1", "east-1"): lossy,
                          ("east-0", "east-1"): inside}, topology)
    assert states == (
        PairState("east-0", "west-0", 4, "cubic", clean.base_rtt, 600 * MSS, 420 * MSS),
        PairState("west-1", "east-1", 1, "cubic", lossy.base_rtt, 100 * MSS, 70 * MSS),
        PairState("west-1", "east-1", 1, "cubic", lossy.base_rtt, 300 * MSS, math.inf))


def _simulate(*args: str) -> str:
    """`testbed simulate ARGS`' output."""
    with CliRunner().isolation() as (out, _, _):
        try:
            main(["simulate", *args])
        except SystemExit as exc:
            assert not exc.code, out.getvalue().decode()
        return out.getvalue().decode()


def test_a_simulated_run_records_where_its_pairs_slow_starts_stop(tmp_path: Path) -> None:
    """results.json's rows are the pairs the simulator ended with (the same inputs run
    again), and the run's summary says where their slow starts stop."""
    output = _simulate(str(DETOUR), "-p", "1f1b", "--out", str(tmp_path / "run"))
    rows = json.loads((tmp_path / "run" / "results.json").read_text())["wan_connections"]
    inputs = load_inputs(DETOUR)
    policy = training_policy("1f1b")
    plan = plan_with_simulator(policy, inputs.topology, inputs.job)
    simulator = Simulator(inputs.topology, inputs.job, plan, policy)
    simulator.run()
    pairs = {key: pair for key, pair in simulator.transfers.pairs.items()
             if key[0].rsplit("-", 1)[0] != key[1].rsplit("-", 1)[0]}
    assert [(r["host"], r["peer"]) for r in rows] == sorted(pairs)
    for row in rows:
        pair = pairs[row["host"], row["peer"]]
        assert row["connections"] == pair.connections
        assert row["cwnd_segments"] == round(pair.cwnd / MSS)
        assert row["ssthresh_segments"] == round(pair.ssthresh / MSS)  # every one was cut
        assert row["retransmitted_segments"] is None and row["bytes_sent"] is None
    thresholds = [r["ssthresh_segments"] for r in rows]
    assert (f"WAN TCP       {len(rows)} connections: slow start ends at "
            f"{min(thresholds):,}-{max(thresholds):,} segments on {len(rows)}") in output


def test_a_run_inside_one_dc_records_no_wan_connections(tmp_path: Path) -> None:
    path = tmp_path / "one-dc.yaml"
    path.write_text("name: one-dc\n"
                    "datacenters:\n  - {name: east, gpus: 2, gpu: a100, bandwidth: 10Gbit}\n"
                    "job: {model: tiny, microbatch_size: 2, microbatches: 4, iterations: 2}\n")
    output = _simulate(str(path), "-p", "gpipe", "--out", str(tmp_path / "run"))
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert "wan_connections" not in results
    assert "WAN TCP" not in output
