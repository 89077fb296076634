"""WAN queues too shallow for the round trips crossing them (testbed.plan.queue_mismatch): found
from the topology and the plan, recorded by a run and said beside its figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from testbed.experiments.planning import plan_with_simulator
from testbed.job.load import load_job
from testbed.plan.queue_mismatch import queue_mismatches
from testbed.policy.registry import training_policy
from testbed.topology import parse_topology

from .test_cli import call

ROOT = Path(__file__).resolve().parent.parent
DETOUR = ROOT / "scripts" / "fidelity_topologies" / "detour-3dc.yaml"


def _topology(links: list[dict[str, Any]], congestion: str = "cubic") -> dict[str, Any]:
    return {
        "name": "t",
        "tcp": {"congestion": congestion},
        "datacenters": [{"name": n, "gpus": 2, "gpu": "a100", "bandwidth": "100Gbit"}
                        for n in ("h", "x", "y")],
        "wan": links,
        "job": {"model": "gpt2", "microbatch_size": 1, "microbatches": 4, "dp": 2, "pp": 3,
                "iterations": 2},
    }


HX = {"between": ["h", "x"], "latency": "5ms", "bandwidth": "500Mbit"}
HY = {"between": ["h", "y"], "latency": "40ms", "bandwidth": "500Mbit"}
XY = {"between": ["x", "y"], "latency": "45ms", "bandwidth": "500Mbit"}


def _found(raw: dict[str, Any]) -> list[tuple[str, str, str, float, float]]:
    topology = parse_topology(raw, "t.yaml")
    job = load_job(topology.job, "t.yaml", None, [])
    plan = plan_with_simulator(training_policy("gpipe"), topology, job)
    return [(e["link"], e["pair"], e["kind"], round(e["queue_s"], 6),
             round(e["round_trip_s"], 6)) for e in queue_mismatches(topology, plan)]


def test_a_detour_crosses_each_link_with_its_whole_round_trip() -> None:
    """Stages in file order (h, x, y) with no x-y link: x's activations go to y through h,
    crossing h-x's queue (one bandwidth-delay product of its own 10 ms) at 90 ms."""
    assert _found(_topology([HX, HY])) == [
        ("x>h", "x>y", "shallow", 0.01, 0.09), ("h>y", "x>y", "shallow", 0.08, 0.09),
        ("y>h", "y>x", "shallow", 0.08, 0.09), ("h>x", "y>x", "shallow", 0.01, 0.09)]


def test_a_queue_deep_enough_for_the_detour_is_not_named() -> None:
    """h-x's queue sized for the 90 ms detour: h's and x's own 10 ms flows can keep it
    standing in front of the detoured ones, which the simulator models
    (testbed.sim.queues)."""
    deep = [{**link, "queue": "5625KB"} for link in (HX, HY)]
    assert _found(_topology(deep)) == []


def test_links_sized_for_their_flows_are_not_named() -> None:
    """The same round trips over direct links: each link's queue is one bandwidth-delay
    product of the one round trip that crosses it."""
    assert _found(_topology([HX, HY, XY])) == []


def test_a_queue_set_off_its_own_links_round_trip_is_named_only_below_it() -> None:
    """Below one bandwidth-delay product a lone flow cannot keep its link busy; above,
    with no shorter round trip beside it, nothing waits behind its queue."""
    small = {**XY, "queue": "64KiB"}
    found = _found(_topology([HX, HY, small]))
    assert [(link, pair, kind) for link, pair, kind, _q, _rtt in found] == [
        ("x>y", "x>y", "shallow"), ("y>x", "y>x", "shallow")]
    assert found[0][3] == round(65536 * 8 / 500e6, 6)
    assert _found(_topology([HX, HY, {**XY, "queue": "20MB"}])) == []


def test_bbr_which_does_not_halve_its_window_on_loss_is_not_named() -> None:
    assert _found(_topology([HX, HY], congestion="bbr")) == []


def test_a_run_over_a_detour_records_and_says_its_mismatched_queues(tmp_path: Path) -> None:
    out = tmp_path / "detour"
    code, stdout, _ = call(["simulate", str(DETOUR), "-p", "gpipe", "--set", "iterations=2",
                            "--out", str(out)])
    assert code == 0
    recorded = json.loads((out / "results.json").read_text())["queue_mismatches"]
    assert {(e["link"], e["pair"]) for e in recorded} >= {("x>h", "x>y"), ("h>x", "y>x")}
    assert ("  queues        x>y through x>h (shallow: 10 ms of queue, 90 ms round trip), "
            "y>x through h>x (shallow: 10 ms of queue, 90 ms round trip): real TCP loses in "
            "a queue shallower than its round trip") in stdout
    code, _, _ = call(["results", "validate", str(out)])
    assert code == 0


def test_a_run_whose_queues_suit_its_flows_says_nothing_of_them(tmp_path: Path) -> None:
    out = tmp_path / "paper"
    code, stdout, _ = call(["simulate", str(ROOT / "topologies" / "two-dc.yaml"), "-p",
                            "gpipe", "--out", str(out)])
    assert code == 0
    assert "queue_mismatches" not in json.loads((out / "results.json").read_text())
    assert "queues " not in stdout


def test_the_plan_names_its_mismatched_queues() -> None:
    code, stdout, _ = call(["plan", str(DETOUR), "-p", "gpipe"])
    assert code == 0
    assert "  WAN queues: x>y through x>h (shallow: 10 ms of queue, 90 ms round trip)" in stdout
    code, stdout, _ = call(["plan", str(ROOT / "topologies" / "two-dc.yaml"), "-p", "gpipe"])
    assert code == 0
    assert "WAN queues" not in stdout
