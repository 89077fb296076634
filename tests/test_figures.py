"""`testbed figures`: claims as data, their figures from runs, the records and the
documentation's table, and the command end to end on a small topology in the simulator."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from testbed.figures.claims import (
    Conditions,
    RunFigures,
    claims,
    multi_tcp_link,
)
from testbed.figures.collect import BackendFigures, Measurement, records
from testbed.figures.measure import figures_of
from testbed.figures.render import claims_table, has_markers, update_markdown
from testbed.job.load import parse_job
from testbed.plan.tcp_model import window_efficiency
from testbed.sim.one_transfer import one_transfer_s
from testbed.topology import parse_topology

ROOT = Path(__file__).resolve().parent.parent
THREE = parse_topology({
    "datacenters": [{"name": n, "gpus": 4} for n in ("a", "b", "c")],
    "wan": [{"between": ["a", "b"], "latency": "20ms", "bandwidth": "10Gbit"},
            {"between": ["b", "c"], "latency": "30ms", "bandwidth": "10Gbit"}],
}, "three.yaml")
JOB = parse_job({"model": "tiny", "microbatch_size": 1, "global_batch": 48})
COND = Conditions("three.yaml", "three DCs")


def _run(seconds: float, tokens: float | None = None, training: float = 0.5,
         total: float = 0.5) -> RunFigures:
    """A run's figures; tokens/s as for a fixed batch per iteration unless given."""
    if tokens is None and seconds:
        tokens = 1000 / seconds
    return RunFigures(seconds, tokens, training, total, "dp 1 x pp 1 on a")


def _spec(claim_id: str) -> object:
    return next(s for s in claims(THREE, JOB, COND) if s.id == claim_id)


def test_every_claim_of_the_issue_is_there_with_a_paper_figure() -> None:
    ids = [s.id for s in claims(THREE, JOB, COND)]
    assert ids == ["multi_tcp", "pp_vs_dp", "temporal", "atlas_vs_pipelines", "atlas_vs_dp",
                   "weak_scaling", "dc_selection", "bubbles_after_atlas",
                   "bubbletea_utilization", "bubbletea_slowdown"]
    assert all(s.paper for s in claims(THREE, JOB, COND))


def test_weak_scaling_grows_the_batch_with_the_dcs() -> None:
    spec = _spec("weak_scaling")
    asks = spec.runs  # type: ignore[attr-defined]
    assert [(a.dcs, a.sets) for a in asks] == [
        (1, ("global_batch=16",)), (2, ("global_batch=32",)), (3, ("global_batch=48",))]
    runs = {"dcs=1": _run(1, tokens=100), "dcs=2": _run(1, tokens=180),
            "dcs=3": _run(1, tokens=240)}
    assert spec.value(runs) == pytest.approx(0.8)  # type: ignore[attr-defined]


def test_temporal_sharing_runs_every_dc_as_one_stage() -> None:
    spec = _spec("temporal")
    assert {a.sets for a in spec.runs} == {("dp=4", "pp=3")}  # type: ignore[attr-defined]
    value = spec.value({"fair": _run(18.0), "temporal": _run(10.0)})  # type: ignore[attr-defined]
    assert value == pytest.approx(1.8)


def test_atlas_is_compared_with_the_better_baseline() -> None:
    spec = _spec("atlas_vs_pipelines")
    runs = {"atlas": _run(2.0), "gpipe": _run(9.0), "1f1b": _run(6.0)}
    assert spec.value(runs) == pytest.approx(3.0)  # type: ignore[attr-defined]
    runs["1f1b"] = _run(None)  # type: ignore[arg-type]
    assert spec.value(runs) == pytest.approx(4.5)  # type: ignore[attr-defined]


def test_speedups_are_ratios_of_tokens_per_s() -> None:
    """A run whose iterations differ in length: its median iteration says 5x, what it
    processed says 2x."""
    spec = _spec("atlas_vs_dp")
    runs = {"atlas": _run(2.0, tokens=200), "dp-across-dc": _run(10.0, tokens=100)}
    assert spec.value(runs) == pytest.approx(2.0)  # type: ignore[attr-defined]
    slow = _spec("bubbletea_slowdown")
    runs = {"none": _run(10.0, tokens=100), "bubbletea": _run(10.0, tokens=80)}
    assert slow.value(runs) == pytest.approx(25.0)  # type: ignore[attr-defined]


def test_slowdown_and_utilization_in_percent() -> None:
    slow = _spec("bubbletea_slowdown")
    assert slow.value({"none": _run(10.0), "bubbletea": _run(10.1)}) == pytest.approx(1.0)  # type: ignore[attr-defined]
    util = _spec("bubbletea_utilization")
    assert util.value({"bubbletea": _run(1, total=0.93)}) == pytest.approx(93.0)  # type: ignore[attr-defined]
    idle = _spec("bubbles_after_atlas")
    assert idle.value({"atlas": _run(1, training=0.75)}) == pytest.approx(25.0)  # type: ignore[attr-defined]


def test_the_multi_tcp_link_is_the_one_with_most_connections() -> None:
    assert multi_tcp_link(THREE, [("a", "b", 3), ("b", "c", 7)]) == (("b", "c"), 7)
    assert multi_tcp_link(THREE, [("a", "c", 5)]) is None  # no direct link
    assert multi_tcp_link(THREE, []) is None


def test_one_transfer_with_open_windows_is_window_limited() -> None:
    """One flow keeps its share of 4 MiB at 10 Gbit/s in flight per 60 ms round trip; many
    fill the link."""
    nbytes = 21 * 2**20
    one = one_transfer_s(THREE, "b", "c", nbytes, 1, warm=True)
    window = window_efficiency(10e9) * 4 * 2**20
    assert one == pytest.approx(0.03 + nbytes / (window / 0.06), rel=1e-6)
    many = one_transfer_s(THREE, "b", "c", nbytes, 32, warm=True)
    assert many == pytest.approx(0.03 + nbytes * 8 / 10e9, rel=0.05)
    assert one_transfer_s(THREE, "b", "c", nbytes, 32, warm=False) > many


def _measurement(claim_id: str, value: float | None) -> Measurement:
    figures: BackendFigures = {"value": value, "runs": {}}
    if value is None:
        figures["why_none"] = "it failed"
    return Measurement(_spec(claim_id), COND, figures)  # type: ignore[arg-type]


def test_records_keep_the_other_backends_column() -> None:
    first = records([_measurement("temporal", 1.7)], "simulate", [])
    assert first[0]["simulate"] == 1.7 and first[0]["emulate"] is None
    assert "emulate" in first[0]["not_run"]
    both = records([_measurement("temporal", 1.5)], "emulate", first)
    assert (both[0]["simulate"], both[0]["emulate"]) == (1.7, 1.5)
    assert both[0]["not_run"] == {}
    failed = records([_measurement("temporal", None)], "emulate", first)
    assert failed[0]["not_run"]["emulate"] == "it failed"


def test_the_table_is_replaced_between_the_markers_of_any_markdown_file(
        tmp_path: Path) -> None:
    saved = records([_measurement("temporal", 1.2)], "simulate", [])
    table = claims_table(saved)
    assert "1.20x (below target)" in table and "up to 1.82x" in table
    page = tmp_path / "page.md"
    begin = "<!-- paper-claims:begin (any command) -->"
    page.write_text(f"intro\n{begin}\nold\n<!-- paper-claims:end -->\nrest\n")
    assert has_markers(page)
    update_markdown(page, saved)
    text = page.read_text()
    assert "old" not in text and table in text and text.endswith("rest\n")
    assert text.startswith(f"intro\n{begin}\n")  # the begin marker as it was written
    page.write_text("no markers\n")
    assert not has_markers(page)
    with pytest.raises(ValueError, match="no"):
        update_markdown(page, saved)


def test_the_documentations_claims_page_has_the_markers() -> None:
    """`testbed figures --readme docs/claims.md` has its table to replace."""
    assert has_markers(ROOT / "docs" / "claims.md")


def _figures(args: list[str]) -> tuple[int, str]:
    from .test_cli import call

    code, out, err = call(["figures", *args])
    return code, out + err


def test_figures_end_to_end_on_a_small_topology(tmp_path: Path) -> None:
    out = tmp_path / "figures"
    code, output = _figures(["--conditions", str(ROOT / "topologies" / "two-dc.yaml"),
                             "--claims", "pp_vs_dp,atlas_vs_pipelines,multi_tcp",
                             "--out", str(out), "--frontier", "off"])
    assert code == 0, output
    saved = json.loads((out / "claims.json").read_text())
    assert [r["id"] for r in saved] == ["multi_tcp:two-dc", "pp_vs_dp:two-dc",
                                         "atlas_vs_pipelines:two-dc"]
    for record in saved:
        assert set(record) >= {"id", "claim", "paper", "unit", "simulate", "emulate",
                               "conditions", "command"}
        assert record["emulate"] is None and record["not_run"]["emulate"]
        assert (out / f"{record['id'].replace(':', '-')}.png").stat().st_size > 0
    assert saved[1]["simulate"] is not None and saved[1]["simulate"] > 0
    assert saved[1]["why"] and saved[1]["up_to"] is None  # no search asked for
    assert not list(out.glob("frontier-*"))
    assert "| claim | paper |" in (out / "figures.md").read_text()


@pytest.mark.parametrize(("args", "message"), [
    (["--claims", "nonsense"], "--claims: unknown claim nonsense"),
    (["--conditions", "missing.yaml"], "missing.yaml"),
    (["--readme", str(ROOT / "pyproject.toml")], "--readme: "),
])
def test_bad_figures_input_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    code, output = _figures(["--out", str(tmp_path / "o"), *args])
    assert code == 2
    assert message in output and len(output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_figures_refuses_a_directory_of_other_files(tmp_path: Path) -> None:
    (tmp_path / "other.txt").write_text("x")
    code, output = _figures(["--out", str(tmp_path), "--claims", "pp_vs_dp",
                             "--conditions", str(ROOT / "topologies" / "two-dc.yaml")])
    assert code == 2
    assert "no claims.json" in output


def test_the_search_keeps_the_stated_conditions_and_survives_the_other_backend() -> None:
    from testbed.figures.collect import with_frontiers
    from testbed.figures.frontier import UpTo

    first = records([_measurement("temporal", 1.7)], "simulate", [])
    searched = UpTo(value=1.5, conditions="one-way 5 ms, 1Gbit", point={}, reached=False,
                    why="fair is busy", points=12, search="coarse")
    found = with_frontiers(first, {("temporal", "three.yaml"): searched})
    up_to = found[0]["up_to"]
    assert up_to is not None
    assert (up_to["value"], up_to["conditions"]) == (1.7, "the stated conditions (three.yaml)")
    higher = with_frontiers(first, {("temporal", "three.yaml"): {**searched, "value": 1.75}})
    assert higher[0]["up_to"] is not None and higher[0]["up_to"]["value"] == 1.75
    both = records([_measurement("temporal", 1.5)], "emulate", higher)
    assert both[0]["up_to"] == higher[0]["up_to"]
    assert "1.75x (below target; at one-way 5 ms, 1Gbit)" in claims_table(both)


def test_a_gpu_holding_two_stages_counts_once() -> None:
    """ZB-V's placement names each GPU under two stages: the claims' reasons count GPUs."""
    placement = {"0,0": ["east-0"], "0,1": ["east-1"], "0,2": ["east-1"], "0,3": ["east-0"]}
    from testbed.experiments.inputs import load_inputs
    from testbed.experiments.run import simulated
    from testbed.run.spec import RunSpec

    inputs = load_inputs(ROOT / "topologies" / "two-dc.yaml")
    spec = RunSpec.build("simulate", inputs.topology, inputs.job, policy="1f1b")
    results = simulated(spec).typed()
    figures = figures_of(dataclasses.replace(
        results, plan={"dp": 1, "pp": 4, "placement": placement}))
    assert figures.gpus == 2 and figures.plan == "dp 1 x pp 4 on east"
