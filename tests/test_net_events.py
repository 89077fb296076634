"""Network events: parsing, the timed changes they imply, and the simulator applying them."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.errors import InputError
from testbed.experiments.inputs import load_inputs
from testbed.experiments.run import run
from testbed.run.spec import RunSpec
from testbed.sim.links import resume_after_outage
from testbed.topology import load_topology
from testbed.topology.net_events import NetEvent, changes, parse_event, parse_event_flag

pytestmark = pytest.mark.usefixtures("shared_planning")

ROOT = Path(__file__).resolve().parent.parent
THREE = ROOT / "topologies" / "paper-3dc.yaml"
TOPO = load_topology(THREE)


def test_flag_and_file_forms_agree() -> None:
    flag = parse_event_flag("at=30s,link=east-central,down=10s", TOPO)
    item = parse_event({"at": "30s", "link": ["east", "central"], "down": "10s"}, TOPO, "t.yaml",
                       "events[0]")
    assert flag == item
    assert (flag.at_s, flag.kind, flag.for_s) == (30.0, "down", 10.0)


@pytest.mark.parametrize("raw", [
    "at=1s,link=east-central,latency=80ms,for=5s",
    "at=0s,link=central-west,bandwidth=200Mbit",
    "at=2.5s,link=east-west,loss=1%,for=1s",
    "at=3s,link=east-west,down=4s",
])
def test_an_event_reads_back_from_what_results_record(raw: str) -> None:
    event = parse_event_flag(raw, TOPO)
    assert parse_event(event.as_raw(), TOPO, None, "events[0]") == event


@pytest.mark.parametrize(("item", "problem"), [
    ({"at": "1s", "link": ["east", "moon"], "down": "1s"}, "events[0].link: no WAN link"),
    ({"at": "-1s", "link": "east-west", "down": "1s"}, "events[0].at: must not be negative"),
    ({"at": "1s", "link": "east-west"}, "events[0]: give exactly one of"),
    ({"at": "1s", "link": "east-west", "down": "1s", "loss": "1%"}, "give exactly one"),
    ({"at": "1s", "link": "east-west", "bandwidth": "0Gbit"}, "must be from 1Mbit to 1000Tbit"),
    ({"at": "1s", "link": "east-west", "latency": "20s"}, "must be from 0s to 10s"),
    ({"at": "1s", "link": "east", "down": "1s"}, "expected two datacenters"),
    ({"at": "1s", "link": "east-west", "down": "1s", "when": 3}, "when"),
])
def test_bad_events_are_located(item: dict[str, object], problem: str) -> None:
    with pytest.raises(InputError) as info:
        parse_event(item, TOPO, "t.yaml", "events[0]")
    assert problem in str(info.value)
    assert str(info.value).startswith("t.yaml: events[0]")


def test_a_bad_event_in_a_topology_file_names_file_and_key(tmp_path: Path) -> None:
    text = THREE.read_text() + "events:\n  - {at: 5s, link: [east, nowhere], down: 2s}\n"
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(InputError, match=r"t\.yaml: events\[0\]\.link: no WAN link"):
        load_topology(path)


def test_changes_are_ordered_and_restore_the_link() -> None:
    events = (parse_event_flag("at=5s,link=east-central,latency=80ms,for=10s", TOPO),
              parse_event_flag("at=1s,link=east-west,down=2s", TOPO))
    out = changes(events, TOPO)
    assert [c.at_s for c in out] == [1.0, 3.0, 5.0, 15.0]
    assert out[0].loss == 1.0 and out[1].loss == TOPO.link("east", "west").loss
    assert out[2].latency_s == 0.08 and out[3].latency_s == TOPO.link("east", "central").latency_s
    assert [c.revert for c in out] == [False, True, False, True]


def test_tcp_comes_back_on_its_retransmission_schedule() -> None:
    assert resume_after_outage(0.1, 0.25) == 0.25
    assert resume_after_outage(1.0, 0.25) == 0.25 + 0.5 + 1.0  # 0.25, 0.75, then 1.75
    assert resume_after_outage(0.0, 0.25) == 0.0


def _simulate(tmp_path: Path, *events: str, iterations: int = 4) -> dict[str, object]:
    inputs = load_inputs(THREE, events=events, iterations=iterations)
    spec = RunSpec.build("simulate", inputs.topology, inputs.job, policy="atlas",
                         events=inputs.events)
    return run(spec, tmp_path / "run").results


def test_simulated_outage_stalls_one_iteration_then_training_recovers(tmp_path: Path) -> None:
    calm = _simulate(tmp_path / "calm")["iteration_time_s"]
    assert isinstance(calm, dict)
    base = calm["median"]
    at = calm["all"][0] + 0.2 * base  # early in the second iteration, whatever its length
    hit = _simulate(tmp_path / "hit", f"at={at:.3f}s,link=east-central,down=3s")
    times = hit["iteration_time_s"]
    assert isinstance(times, dict)
    # the first iteration starts with cold windows: compare each with its calm twin
    slow = [(t, c) for t, c in zip(times["all"], calm["all"], strict=True) if t > c * 1.01]
    assert len(slow) == 1 and slow[0][0] >= slow[0][1] + 3.0  # at least the outage itself
    assert times["all"][-1] == pytest.approx(base, rel=1e-3)  # and then as before


@pytest.mark.parametrize("event", ["at=0s,link=east-central,latency=100ms",
                                   "at=0s,link=east-central,bandwidth=100Mbit"])
def test_simulated_slower_link_makes_iterations_slower(tmp_path: Path, event: str) -> None:
    calm = _simulate(tmp_path / "calm", iterations=2)["iteration_time_s"]
    hit = _simulate(tmp_path / "hit", event, iterations=2)["iteration_time_s"]
    assert isinstance(calm, dict) and isinstance(hit, dict)
    assert hit["median"] > calm["median"] * 1.05


def test_events_are_in_the_results_and_the_trace(tmp_path: Path) -> None:
    import gzip
    import json

    results = _simulate(tmp_path, "at=20s,link=east-central,down=10s")
    assert results["events"] == [{"at": "20s", "link": ["east", "central"], "down": "10s",
                                  "applied": True}]
    trace = json.loads(gzip.decompress((tmp_path / "run" / "trace.json.gz").read_bytes()))
    marks = [e for e in trace["traceEvents"] if e.get("name") == "net_event"]
    assert len(marks) == 1 and marks[0]["dur"] == pytest.approx(10e6)
    assert "down" in marks[0]["args"]["detail"]


def test_overlapping_events_restore_what_was_beneath() -> None:
    events = (parse_event_flag("at=0s,link=east-west,loss=1%", TOPO),
              parse_event_flag("at=10s,link=east-west,down=5s", TOPO),
              parse_event_flag("at=12s,link=east-west,down=1s", TOPO))
    out = [(c.at_s, c.loss) for c in changes(events, TOPO)]
    assert out == [(0.0, 0.01), (10.0, 1.0), (15.0, 0.01)]  # still lossy after the outage


def _settings(out: list[Any]) -> list[tuple[float, str, str, Any, Any, Any]]:
    """Changes as what they set, per direction, in time order."""
    rows = []
    for c in out:
        for a, b in [(c.a, c.b)] if c.one_way else [(c.a, c.b), (c.b, c.a)]:
            rows.append((c.at_s, a, b, c.latency_s, c.bandwidth_bps, c.loss))
    return sorted(rows, key=lambda r: (r[0], r[1], r[2], str(r[3:])))


def _by_rule(events: list[NetEvent]) -> list[tuple[float, str, str, Any, Any, Any]]:
    """What `changes` must give, from its rule alone: at each start or end, per direction
    and property, the active event of highest rank (events over traces, then the latest
    start, then the latest listed), else the topology's value; a change where it moves."""
    fields = {"down": "loss", "loss": "loss", "latency": "latency_s",
              "bandwidth": "bandwidth_bps"}
    rows = []
    for a, b in (("east", "west"), ("west", "east"), ("east", "central"),
                 ("central", "east")):
        if not TOPO.has_link(a, b):
            continue
        link = TOPO.link(a, b)
        for field in ("latency_s", "bandwidth_bps", "loss"):
            mine = [(i, e) for i, e in enumerate(events) if fields[e.kind] == field
                    and ((e.a, e.b) == (a, b) or (not e.one_way and (e.b, e.a) == (a, b)))]
            ends = {e.at_s + e.for_s for _, e in mine if e.for_s is not None}
            current = getattr(link, field)
            for t in sorted({e.at_s for _, e in mine} | ends):
                active = [(i, e) for i, e in mine if e.at_s <= t and
                          (e.for_s is None or e.at_s + e.for_s > t)]
                top = max(active, key=lambda item: (item[1].trace is None, item[1].at_s,
                                                     item[0]), default=None)
                value = top[1].value if top else getattr(link, field)
                if value != current:
                    current = value
                    rows.append((t, a, b, *(value if f == field else None
                                            for f in ("latency_s", "bandwidth_bps", "loss"))))
    return sorted(rows, key=lambda r: (r[0], r[1], r[2], str(r[3:])))


@given(st.lists(st.tuples(st.sampled_from([0.0, 1.0, 2.0, 3.0]),
                          st.sampled_from(["east-west", "west>east", "east-central"]),
                          st.sampled_from(["latency", "bandwidth", "loss"]),
                          st.integers(1, 3), st.sampled_from([None, 0.5, 1.0, 2.5]),
                          st.booleans()), max_size=12))
def test_changes_keep_the_event_of_highest_rank_in_force(raw: list[Any]) -> None:
    events = []
    for at, link, kind, level, lasting, traced in raw:
        a, b = link.replace(">", "-").split("-")
        value = {"latency": level * 0.01, "bandwidth": level * 1e8, "loss": level * 0.01}[kind]
        events.append(NetEvent(at, a, b, kind, value, lasting, one_way=">" in link,
                               trace="t.csv" if traced else None))
    assert _settings(changes(events, TOPO)) == _by_rule(events)


def _calls(work: Callable[[], object]) -> int:
    """Python functions and builtins `work` calls: its cost, counted, not timed."""
    count = 0

    def counting(_frame: Any, event: str, _arg: Any) -> None:
        nonlocal count
        count += event in ("call", "c_call")

    sys.setprofile(counting)
    try:
        work()
    finally:
        sys.setprofile(None)
    return count


def test_changes_cost_about_as_much_per_event_however_many_are_in_force() -> None:
    """Events that each last the rest of the run are all in force at once: the change at
    each one's start looked over every one before it, so 8,000 of them took 37 s and
    20,001 over two minutes. Four times the events may cost not much more than four
    times the work (a heap: a logarithm each), where they cost sixteen."""
    def events(n: int) -> list[NetEvent]:
        return [NetEvent(i * 0.001, "east", "west", "latency", 0.01 + i % 7 * 1e-3, None)
                for i in range(n)]

    small, large = _calls(lambda: changes(events(400), TOPO)), \
        _calls(lambda: changes(events(1600), TOPO))
    assert large < 6 * small, (small, large)
