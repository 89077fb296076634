"""Scenario files: reading them (one-line errors naming file, key and problem), link
traces as timed link changes (per direction, beneath events), stragglers, and the
simulator running them."""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from testbed.errors import InputError
from testbed.experiments.inputs import load_inputs
from testbed.experiments.run import run
from testbed.run.recovery import shift_events
from testbed.run.spec import RunSpec
from testbed.scenario.link_traces import MAX_STEPS, MAX_TRACE_BYTES, read_trace_csv
from testbed.scenario.scenario import load_scenario
from testbed.scenario.slowdowns import Slowdown, Straggler, factor_at
from testbed.topology import load_topology
from testbed.topology.net_events import changes, parse_event_flag

ROOT = Path(__file__).resolve().parent.parent
TWO = ROOT / "topologies" / "two-dc.yaml"
THREE = ROOT / "topologies" / "paper-3dc.yaml"
TOPO = load_topology(TWO)


def _scenario(tmp_path: Path, text: str, **files: str) -> Path:
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    return path


def test_a_scenario_reads_traces_stragglers_failures_and_events(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    path = _scenario(tmp_path, """
events:
  - {at: 3s, link: east-west, down: 1s}
traces:
  - {link: [east, west], csv: data/bw.csv}
  - {link: west>east, diurnal: {low: 100Mbit, high: 1Gbit, period: 10s, for: 20s}}
stragglers:
  - {at: 0s, gpu: west-0, slower: 1.5, for: 5s}
  - {dc: east, slower: 2}
failures:
  - {at: 2s, worker: east-1, back: 10s}
recovery: {detect: 2s, restart: 30s}
""", **{"data/bw.csv": "time_s,bandwidth,latency,loss\n0,500Mbit,,\n1.5,200Mbit,30ms,1%\n"})
    scenario, events = load_scenario(path, TOPO)
    assert [e.kind for e in events] == ["down"]
    bw, walk = scenario.traces
    assert (bw.a, bw.b, bw.one_way, bw.name) == ("east", "west", False, "data/bw.csv")
    assert [(p.at_s, p.bandwidth_bps, p.latency_s, p.loss) for p in bw.points] == [
        (0.0, 500e6, None, None), (1.5, 200e6, 0.03, 0.01)]
    assert (walk.a, walk.b, walk.one_way) == ("west", "east", True)
    assert len(walk.points) == 48  # period / 24 a step, for two periods
    assert scenario.stragglers == (Straggler(0.0, 5.0, 1.5, gpu="west-0"),
                                   Straggler(0.0, None, 2.0, dc="east"))
    (loss,) = scenario.failures
    assert (loss.at_s, loss.worker, loss.back_s) == (2.0, "east-1", 10.0)
    assert (scenario.recovery.detect_s, scenario.recovery.restart_s) == (2.0, 30.0)


@pytest.mark.parametrize(("text", "files", "where", "problem"), [
    ("trace: []", {}, "scenario.yaml: trace", "unknown key (did you mean 'traces'?)"),
    ("traces: [{link: [east, moon], csv: a.csv}]", {}, "traces[0].link", "no WAN link"),
    ("traces: [{link: east, csv: a.csv}]", {}, "traces[0].link", "expected two datacenters"),
    ("traces: [{link: east-west}]", {}, "traces[0]", "give exactly one of csv, diurnal"),
    ("traces: [{link: east-west, csv: none.csv}]", {}, "none.csv", "no such file"),
    ("traces: [{link: east-west, csv: a.csv}]", {"a.csv": "time_s,rate\n0,1Gbit\n"},
     "a.csv: header", "column 2 is not one of time_s, bandwidth, latency, loss"),
    ("traces: [{link: east-west, csv: a.csv}]", {"a.csv": "time_s,latency\n0,1ms\n"},
     "a.csv: header", "no 'bandwidth' column"),
    ("traces: [{link: east-west, csv: a.csv}]", {"a.csv": "time_s,bandwidth\n0,fast\n"},
     "a.csv: line 2.bandwidth", "expected a rate like '10Gbit'"),
    ("traces: [{link: east-west, csv: a.csv}]",
     {"a.csv": "time_s,bandwidth\n1,1Gbit\n1,2Gbit\n"},
     "a.csv: line 3.time_s", "is not after the previous row's"),
    ("traces: [{link: east-west, csv: a.csv}]",
     {"a.csv": "time_s,bandwidth,loss\n0,1Gbit,100%\n"},
     "a.csv: line 2.loss", "expected a loss like '1%', below 100%"),
    ("traces: [{link: east-west, csv: a.csv}]", {"a.csv": "time_s,bandwidth\n0,1Gbit,3\n"},
     "a.csv: line 2", "3 cells, the header has 2"),
    ("traces: [{link: east-west, csv: a.csv}]", {"a.csv": "time_s,bandwidth\n"},
     "a.csv", "no rows after the header"),
    ("traces: [{link: east-west, diurnal: {low: 1Gbit, high: 2Gbit, period: 1s}}]", {},
     "traces[0].diurnal.for", "missing value"),
    ("traces: [{link: east-west, diurnal: {low: 2Gbit, high: 1Gbit, period: 1s, for: 1s}}]",
     {}, "traces[0].diurnal.high", "must not be below low"),
    ("traces: [{link: east-west, random-walk: {low: 1Gbit, high: 2Gbit, for: 1h}}]", {},
     "traces[0].random-walk.for", "unknown time unit"),
    ("traces: [{link: east-west, random-walk: {low: 1Gbit, high: 2Gbit, for: 1s, "
     "step: 1us}}]", {}, "traces[0].random-walk.step", "at most 100,000"),
    ("stragglers: [{gpu: west-9, slower: 2}]", {}, "stragglers[0].gpu", "no GPU 'west-9'"),
    ("stragglers: [{dc: moon, slower: 2}]", {}, "stragglers[0].dc", "no datacenter 'moon'"),
    ("stragglers: [{gpu: west-0, dc: west, slower: 2}]", {}, "stragglers[0]",
     "give exactly one of gpu"),
    ("stragglers: [{gpu: west-0, slower: 0.5}]", {}, "stragglers[0].slower",
     "must be from 1 to 1000"),
    ("stragglers: [{gpu: west-0}]", {}, "stragglers[0].slower", "missing value"),
    ("failures: [{at: 1s, worker: east-7}]", {}, "failures[0].worker", "no GPU 'east-7'"),
    ("failures: [{worker: east-1}]", {}, "failures[0].at", "missing value"),
    ("failures: [{at: 5s, worker: east-1, back: 2s}]", {}, "failures[0].back",
     "must be after `at`"),
    ("failures: [{at: 1s, worker: east-1}, {at: 5s, worker: east-1}]", {}, "failures[1]",
     "east-1 is already lost then"),
    ("recovery: {restart: soon}", {}, "recovery.restart", "expected a duration"),
    ("events: [{at: 1s, link: east-moon, down: 1s}]", {}, "events[0].link", "no WAN link"),
    ("[1, 2]", {}, "scenario.yaml", "expected a mapping"),
])
def test_bad_scenarios_are_one_located_line(tmp_path: Path, text: str, files: dict[str, str],
                                            where: str, problem: str) -> None:
    path = _scenario(tmp_path, text, **files)
    with pytest.raises(InputError) as info:
        load_scenario(path, TOPO)
    message = str(info.value)
    assert where in message and problem in message, message
    assert "\n" not in message


def test_a_bad_scenario_is_exit_2_with_one_line_and_nothing_written(tmp_path: Path) -> None:
    path = _scenario(tmp_path, "stragglers: [{gpu: west-0, slower: -1}]")
    out = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-c", "from testbed.cli.main import main; main()", "simulate", str(TWO),
         "--scenario", str(path), "--out", str(out)],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "scenario.yaml: stragglers[0].slower" in lines[0], lines
    assert not out.exists()


def test_a_trace_holds_each_value_until_the_next_row_that_gives_it(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("time_s,bandwidth,latency\n0,500Mbit,\n1,200Mbit,30ms\n2.5,1Gbit,\n")
    scenario, _ = load_scenario(_scenario(tmp_path, "traces: [{link: east>west, csv: t.csv}]"),
                                TOPO)
    out = changes(scenario.link_events(), TOPO)
    assert all(c.one_way and (c.a, c.b) == ("east", "west") for c in out)
    assert [(c.at_s, c.bandwidth_bps, c.latency_s) for c in out] == [
        (0.0, 500e6, None), (1.0, 200e6, None), (1.0, None, 0.03), (2.5, 1e9, None)]


def test_an_event_is_in_force_over_a_trace_and_the_trace_comes_back(tmp_path: Path) -> None:
    scenario, _ = load_scenario(_scenario(
        tmp_path, "traces: [{link: east-west, csv: t.csv}]",
        **{"t.csv": "time_s,bandwidth\n0,500Mbit\n2,300Mbit\n6,400Mbit\n"}), TOPO)
    event = parse_event_flag("at=1s,link=east-west,bandwidth=50Mbit,for=3s", TOPO)
    out = [(c.at_s, c.bandwidth_bps, c.one_way) for c in
           changes((*scenario.link_events(), event), TOPO)]
    # the trace's step at 2 s comes under the event: its value is there when the event ends
    assert out == [(0.0, 500e6, False), (1.0, 50e6, False), (4.0, 300e6, False),
                   (6.0, 400e6, False)]


def test_a_one_way_trace_leaves_the_other_direction_to_the_event(tmp_path: Path) -> None:
    scenario, _ = load_scenario(_scenario(
        tmp_path, "traces: [{link: west>east, csv: t.csv}]",
        **{"t.csv": "time_s,bandwidth\n0,500Mbit\n"}), TOPO)
    event = parse_event_flag("at=1s,link=east-west,bandwidth=50Mbit,for=1s", TOPO)
    out = sorted((c.at_s, c.a, c.b, c.bandwidth_bps, c.one_way)
                 for c in changes((*scenario.link_events(), event), TOPO))
    link = TOPO.link("east", "west").bandwidth_bps
    assert out == [(0.0, "west", "east", 500e6, True), (1.0, "east", "west", 50e6, False),
                   (2.0, "east", "west", link, True), (2.0, "west", "east", 500e6, True)]


def test_generators_are_seeded_and_stay_in_their_bounds(tmp_path: Path) -> None:
    text = ("traces: [{link: east-west, random-walk: {low: 100Mbit, high: 1Gbit, "
            "sigma: 30%, for: 200s, seed: SEED}}]")
    rates = []
    for seed in (1, 1, 2):
        scenario, _ = load_scenario(_scenario(tmp_path, text.replace("SEED", str(seed))),
                                    TOPO)
        rates.append([p.bandwidth_bps for p in scenario.traces[0].points])
    assert rates[0] == rates[1] and rates[0] != rates[2]
    assert len(rates[0]) == 200 and rates[0][0] == 1e9
    assert all(100e6 <= r <= 1e9 for r in rates[0] + rates[2])
    scenario, _ = load_scenario(_scenario(
        tmp_path, "traces: [{link: east-west, diurnal: {low: 100Mbit, high: 1Gbit, "
        "period: 24s, step: 6s, for: 24s}}]"), TOPO)
    assert [p.bandwidth_bps for p in scenario.traces[0].points] == pytest.approx(
        [1e9, 550e6, 100e6, 550e6])


def test_a_trace_file_takes_bare_numbers_in_base_units(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("bandwidth,time_s,loss\n2e8,0,0.01\n")
    (point,) = read_trace_csv(path)
    assert (point.at_s, point.bandwidth_bps, point.loss) == (0.0, 2e8, 0.01)


def test_shifted_events_keep_what_is_left_of_them() -> None:
    events = (parse_event_flag("at=1s,link=east-west,down=4s", TOPO),
              parse_event_flag("at=2s,link=east-west,latency=50ms", TOPO),
              parse_event_flag("at=1s,link=east-west,loss=1%,for=1s", TOPO),
              parse_event_flag("at=9s,link=east-west,bandwidth=100Mbit,for=1s", TOPO))
    out = [(e.kind, e.at_s, e.for_s) for e in shift_events(events, 3.0)]
    assert out == [("down", 0.0, 2.0), ("latency", 0.0, None), ("bandwidth", 6.0, 1.0)]


def test_a_straggler_stretches_compute_that_starts_in_its_window() -> None:
    windows = [Straggler(1.0, 2.0, 1.5, gpu="west-0").window(),
               Straggler(2.0, None, 2.0, dc="west").window()]
    assert [factor_at(windows, t) for t in (0.5, 1.0, 2.5, 3.0)] == [1.0, 1.5, 3.0, 2.0]
    assert Straggler(1.0, 2.0, 1.5, gpu="west-0").shifted(2.0) == Straggler(
        0.0, 1.0, 1.5, gpu="west-0")
    assert Straggler(1.0, 2.0, 1.5, gpu="west-0").shifted(3.0) is None
    assert factor_at([Slowdown(0.0, None, 4.0)], 100.0) == 4.0


def _simulate(tmp_path: Path, name: str, scenario: Path | None, topology: Path = TWO,
              iterations: int = 6, **spec: object) -> dict[str, object]:
    inputs = load_inputs(topology, scenario=scenario, sets=(f"iterations={iterations}",))
    run_spec = RunSpec.build("simulate", inputs.topology, inputs.job, policy="gpipe",
                             events=inputs.events, scenario=inputs.scenario, **spec)  # type: ignore[arg-type]
    return run(run_spec, tmp_path / name).results


def test_a_dc_straggler_slows_compute_by_its_factor_in_the_simulator(tmp_path: Path) -> None:
    calm = _simulate(tmp_path, "calm", None, THREE, 3)
    path = _scenario(tmp_path, "stragglers: [{dc: east, slower: 2}, {dc: central, "
                     "slower: 2}, {dc: west, slower: 2}]")
    slow = _simulate(tmp_path, "slow", path, THREE, 3)
    assert slow["scenario"]["stragglers"][0] == {"at": "0s", "dc": "east", "slower": 2.0,  # type: ignore[index]
                                                 "applied": True}
    def compute_s(name: str) -> float:
        return sum(float(s["end"]) - float(s["start"]) for s in _spans(tmp_path / name)  # type: ignore[arg-type]
                   if s["kind"] in ("forward", "backward"))

    assert compute_s("slow") == pytest.approx(2 * compute_s("calm"))
    assert slow["iteration_time_s"]["median"] > calm["iteration_time_s"]["median"]  # type: ignore[index]


def _spans(directory: Path) -> list[dict[str, object]]:
    import json

    return json.loads((directory / "spans.json").read_text())["spans"]  # type: ignore[no-any-return]


def test_a_simulated_bandwidth_trace_is_the_same_run_as_its_events(tmp_path: Path) -> None:
    path = _scenario(tmp_path, "traces: [{link: east-west, csv: t.csv}]",
                     **{"t.csv": "time_s,bandwidth\n0,100Mbit\n0.3,20Mbit\n"})
    traced = _simulate(tmp_path, "traced", path)
    inputs = load_inputs(TWO, events=("at=0s,link=east-west,bandwidth=100Mbit,for=0.3s",
                                      "at=0.3s,link=east-west,bandwidth=20Mbit"),
                         sets=("iterations=6",))
    spec = RunSpec.build("simulate", inputs.topology, inputs.job, policy="gpipe",
                         events=inputs.events)
    evented = run(spec, tmp_path / "evented").results
    assert traced["iteration_time_s"] == evented["iteration_time_s"]
    calm = _simulate(tmp_path, "calm", None)
    assert traced["iteration_time_s"]["median"] > calm["iteration_time_s"]["median"]  # type: ignore[index]
    marks = [s for s in _spans(tmp_path / "traced") if s["kind"] == "net_event"]
    assert [m["detail"] for m in marks] == ["east<->west follows trace t.csv"]


def test_a_trace_on_one_direction_slows_only_what_crosses_it(tmp_path: Path) -> None:
    slow = "time_s,bandwidth\n0,10Mbit\n"
    forward = _simulate(tmp_path, "forward", _scenario(
        tmp_path, "traces: [{link: east>west, csv: t.csv}]", **{"t.csv": slow}))
    back = _simulate(tmp_path, "back", _scenario(
        tmp_path, "traces: [{link: west>east, csv: t.csv}]", **{"t.csv": slow}))
    spans = {name: [s for s in _spans(tmp_path / name) if s["kind"] == "transfer"
                    and s.get("link")] for name in ("forward", "back")}
    for name, slowed in (("forward", "east>west"), ("back", "west>east")):
        by_link: dict[str, list[float]] = {}
        for s in spans[name]:
            by_link.setdefault(str(s["link"]), []).append(
                float(s["end"]) - float(s["start"]))  # type: ignore[arg-type]
        # the median: a message that starts while the window still grows may also wait
        # up to a round trip for the last one's bytes in flight, whatever the link's rate
        typical = {link: statistics.median(times) for link, times in by_link.items()}
        other = "west>east" if slowed == "east>west" else "east>west"
        latency = TOPO.link("east", "west").latency_s  # what is left is the bytes' time
        assert typical[slowed] - latency > 5 * (typical[other] - latency), (name, typical)
    assert forward["iteration_time_s"] != back["iteration_time_s"]


def test_a_trace_of_too_many_rows_is_refused_at_the_first_row_too_many(
        tmp_path: Path) -> None:
    """Rows are counted as they are read: a trace of millions of short rows was refused
    only once all were parsed (4 million: 38 s and 1.6 GB). What follows the row too many
    (here a cell past the CSV reader's limit) is never read."""
    path = tmp_path / "long.csv"
    rows = "".join(f"{i},1Gbit\n" for i in range(MAX_STEPS + 1))
    path.write_text(f"time_s,bandwidth\n{rows}0,{'1' * 200_000}\n")
    with pytest.raises(InputError) as info:
        read_trace_csv(path)
    assert str(info.value) == (f"{path}: line {MAX_STEPS + 2}: more than 100,000 rows: a "
                               "trace has at most 100,000")


def test_a_trace_file_over_its_size_is_refused_before_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "huge.csv"
    path.write_text("time_s,bandwidth\n0,1Gbit\n#" + "x" * MAX_TRACE_BYTES + "\n")
    with pytest.raises(InputError) as info:
        read_trace_csv(path)
    assert str(info.value) == f"{path}: larger than 16 MiB: not an input file of testbed"
