"""Where "up to" figures hold: the design space's points as topologies, the search over
them (the same whatever the number of processes), what bounds a figure, and `testbed
figures` writing `up_to` and `why` for every claim."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from testbed.figures import frontier, load_curve
from testbed.figures.claims import Conditions
from testbed.figures.frontier import Frontier, Space, search
from testbed.figures.space import MODELS, Point, apply, bdp_bytes, with_dcs
from testbed.figures.why import why
from testbed.job.load import load_job
from testbed.topology import load_topology

from .test_cli import call

pytestmark = pytest.mark.usefixtures("shared_planning")

ROOT = Path(__file__).resolve().parent.parent
SMALL = """\
name: small3
datacenters:
  - {name: east, gpus: 1, gpu: a100, bandwidth: 100Gbit, latency: 50us}
  - {name: central, gpus: 1, gpu: a100, bandwidth: 100Gbit, latency: 50us}
  - {name: west, gpus: 1, gpu: a100, bandwidth: 100Gbit, latency: 50us}
wan:
  - {between: [east, central], latency: 10ms, bandwidth: 10Gbit}
  - {between: [central, west], latency: 15ms, bandwidth: 10Gbit}
  - {between: [east, west], latency: 20ms, bandwidth: 10Gbit}
job:
  model: {layers: 24, hidden: 2560, heads: 20, seq_len: 1024, vocab: 50257}
  microbatch_size: 1
  global_batch: 6
  iterations: 3
  inference:
    model: {layers: 4, hidden: 1024, heads: 8, kv_heads: 1, seq_len: 2048, vocab: 32000}
    arrival_rate: 100/s
    prompt_length: {distribution: uniform, min: 128, max: 1024}
    decode_dc: local
    deadline: 100ms
"""
TINY = Space((5,), (1, 10), (1.0,), (), (2,), (1000,))


@pytest.fixture
def small(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return path


def test_a_point_sets_every_link_buffers_model_and_dcs() -> None:
    paper = load_topology(ROOT / "topologies" / "paper-3dc.yaml")
    point = Point(150, 100, buffers=1.0, model="llama2-70b", dcs=5)
    here = apply(point, paper)
    assert len(here.datacenters) == 5 and len(here.links) == 10  # every pair linked
    assert {(link.latency_s, link.bandwidth_bps) for link in here.links} == {(0.15, 100e9)}
    assert bdp_bytes(point) == 100e9 * 0.3 / 8
    assert here.tcp.wmem[2] == here.tcp.rmem[2] == bdp_bytes(point)
    assert all(dc.gpus == 4 * MODELS["llama2-70b"].tp for dc in here.datacenters)
    job = load_job(here.job, here.source)
    assert (job.tp, job.model.layers) == (8, 80)
    # GPT-3 175B takes two stages per DC; two DCs are the first two
    big = apply(Point(20, 10, model="gpt3-175b", dcs=2), paper)
    assert [dc.name for dc in big.datacenters] == ["east", "central"]
    assert load_job(big.job, big.source).pp == 4
    # buffers never shrink below the defaults; the conditions' own stay as they are
    assert apply(Point(5, 0.1, buffers=0.25), paper).tcp == paper.tcp
    assert apply(Point(5, 0.1), paper).tcp == paper.tcp
    assert with_dcs(paper, 3) == paper


def test_the_best_point_and_whether_it_reaches_the_target() -> None:
    found = Frontier("temporal", {Point(5, 1): {"value": 1.2}, Point(50, 1): {"value": 1.9},
                                  Point(5, 10): {"value": None, "why_none": "failed"}})
    up_to = found.up_to(1.8, False, "coarse")
    assert (up_to["value"], up_to["reached"], up_to["point"]["wan_latency_ms"]) == \
        (1.9, True, 50)
    assert up_to["conditions"] == "one-way 50 ms, 1Gbit" and up_to["points"] == 3
    assert found.up_to(2.0, False, "coarse")["reached"] is False
    assert found.up_to(None, False, "coarse")["reached"] is None
    # a cost (at most 1%): its largest over the space is what must stay within
    assert Frontier("s", {Point(5, 1): {"value": 0.4}}).up_to(1, True, "")["reached"] is True
    assert Frontier("s", {}).up_to(1, True, "")["value"] is None


def test_why_bounds_a_speedup_by_the_baselines_utilization() -> None:
    runs = {"atlas": {"tokens_per_s": 300.0, "utilization_training": 0.75, "gpus": 12,
                      "plan": "dp 2 x pp 6 on a+b"},
            "gpipe": {"tokens_per_s": 100.0, "utilization_training": 0.25, "gpus": 12},
            "1f1b": {"tokens_per_s": 80.0, "utilization_training": 0.2, "gpus": 12}}
    text = why("atlas_vs_pipelines:x", runs, 17)
    assert text is not None
    assert text.startswith("gpipe keeps its 12 GPUs busy 25.0% of the time, which bounds "
                           "any plan on 12 GPUs at 4.00x; atlas keeps its 12 busy 75.0%")
    assert text.endswith("17x needs a baseline busy 5.9% of the time or less")
    assert why("atlas_vs_pipelines:x", {"atlas": {}}, 17) is None  # too little to say


def test_why_one_connection_leaves_little_to_gain() -> None:
    transfer = {"bytes": 10**7, "one_way_s": 0.01, "connections": 8, "bandwidth_bps": 1e9,
                "window_bytes": 4 * 2**20, "one_connection_s": 0.01 + 0.1,
                "many_connections_s": 0.01 + 0.08}
    text = why("multi_tcp:x", {"transfer": transfer}, 20)
    assert text is not None and "one connection moves 0.8 Gbit/s of the 1 Gbit/s link" in text
    assert "at most 1.2x on the bytes" in text and "is 11% of the 10 MB transfer" in text


def test_why_prefills_take_points_of_gpu_time_and_count_the_waiting() -> None:
    """Prefills' share is of all GPU time (25% idle, 16% filled: 16 points, not 16% of
    the 25); requests still queued at the end were waiting too, though none was rejected."""
    requests = {"arrived": 100, "served": 60, "rejected": 0}
    runs = {"bubbletea": {"utilization_training": 0.75, "utilization_total": 0.91,
                          "requests": requests}}
    text = why("bubbletea_utilization:x", runs, 94)
    assert text is not None
    assert "leaves 25.0% of GPU time idle and prefills take 16.0% of GPU time" in text
    assert "serving 60 of 100 requests (0 rejected at the deadline, 40 still waiting" in text
    assert "so the 9.0% left are bubbles too short" in text
    everyone = {**runs["bubbletea"], "requests": {**requests, "served": 100}}
    text = why("bubbletea_utilization:x", {"bubbletea": everyone}, 94)
    assert text is not None and text.endswith("the load, not the bubbles, bounds it")


@pytest.mark.benchmark  # 38 s; tests/test_sweep.py checks one process against two workers
def test_a_search_is_the_same_on_one_process_and_on_two(small: Path) -> None:
    topology = load_topology(small)
    cond = Conditions(str(small), "small")
    space = Space((5, 50), (1,), (1.0,), (), (2,), ())
    wanted = ["pp_vs_dp", "dc_selection"]
    one = search(topology, cond, wanted, space, 1)
    two = search(topology, cond, wanted, space, 2)
    assert one == two
    points = list(one["dc_selection"].results)
    # the grid, then from the best cell each knob in turn
    assert points[:2] == [Point(5, 1), Point(50, 1)]
    best = one["dc_selection"].best()
    assert best is not None
    assert set(points[2:]) == {Point(best[0].latency_ms, 1, buffers=1.0),
                               Point(best[0].latency_ms, 1, dcs=2)}


def test_figures_writes_up_to_and_why_for_every_claim_heat_maps_and_load_curves(
        small: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(frontier.SPACES, "coarse", TINY)
    monkeypatch.setattr(load_curve, "RATES", (100, 1000))
    out = tmp_path / "figures"
    code, text, err = call(["figures", "--conditions", str(small), "--out", str(out),
                            "--workers", "1", "--format", "svg"])
    assert code == 0, err
    saved = json.loads((out / "claims.json").read_text())
    assert len(saved) == 10
    for record in saved:
        claim = record["id"].partition(":")[0]
        assert record["simulate"] is not None, record["not_run"]
        assert record["why"], record["id"]
        up_to = record["up_to"]
        assert up_to["value"] is not None and up_to["conditions"] and up_to["why"]
        assert up_to["value"] >= record["simulate"]  # the stated conditions count too
        assert up_to["points"] >= 3 and up_to["search"] == "coarse"
        if record["target"] is not None:
            assert up_to["reached"] == (up_to["value"] <= record["target"]
                                        if record["at_most"] else
                                        up_to["value"] >= record["target"])
        assert (out / f"{record['id'].replace(':', '-')}.svg").read_text().startswith("<?xml")
        assert (out / f"{record['id'].replace(':', '-')}.csv").stat().st_size > 0
        rows = list(csv.DictReader((out / f"frontier-{claim}.csv").open()))
        assert len(rows) == up_to["points"]
        assert max(float(r["value"]) for r in rows if r["value"]) == up_to["value"] or (
            up_to["value"] == record["simulate"] and up_to["conditions"].startswith("the stated"))
        assert (out / f"frontier-{claim}.svg").exists()
    curve = list(csv.DictReader((out / "load-small.csv").open()))
    assert [int(r["requests_per_s"]) for r in curve] == [100, 1000]
    assert all(0 < float(r["served_share"]) <= 1 for r in curve)
    assert int(curve[1]["arrived"]) > int(curve[0]["arrived"])
    assert "up to, simulated (where)" in text
    assert "What bounds it:" in (out / "figures.md").read_text()
