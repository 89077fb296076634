"""The simulator against closed forms and properties; its CLI."""

from __future__ import annotations

import csv
import gzip
import itertools
import json
from pathlib import Path
from typing import Any, get_args

import pytest
from click.testing import CliRunner
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from testbed.common.spans import Span, SpanKind
from testbed.errors import InputError
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.job.model import Job, ModelShape
from testbed.metrics.summary import run_iteration_s, summarize
from testbed.plan.jitter import Jitter
from testbed.plan.model import Op
from testbed.policy import training_policy
from testbed.report.profile import profile_from_spans
from testbed.sim.agenda import Agenda
from testbed.sim.flows import CWND_OF_FLIGHT, RTO_MIN
from testbed.sim.network import (
    INITIAL_WINDOW,
    PAYLOAD_EFFICIENCY,
    FluidNetwork,
    Pair,
    max_min,
)
from testbed.sim.simulate import StepRows, simulated_iteration_s
from testbed.sim.simulator import Simulator
from testbed.topology import parse_topology
from testbed.topology.net_events import parse_event_flag

from .strategies import job_fitting, topologies

ROOT = Path(__file__).resolve().parent.parent


def _chain(stages: int, bandwidth: str = "1000Tbit", latency: str = "1ns") -> Any:
    names = [f"dc{i}" for i in range(stages)]
    return parse_topology({
        "datacenters": [{"name": n, "gpus": 1, "bandwidth": "1000Tbit", "latency": 0}
                        for n in names],
        "wan": [{"between": [a, b], "latency": latency, "bandwidth": bandwidth}
                for a, b in itertools.pairwise(names)] or [],
    }, "chain.yaml")


def _run(topology: Any, job: Job, policy: str, profile: Any = None,
         jitter: Jitter | None = None) -> Any:
    chosen = training_policy(policy)
    plan = plan_with_simulator(chosen, topology, job)
    result = Simulator(topology, job, plan, chosen, profile, jitter=jitter).run()
    tokens = plan.dp * plan.microbatches * plan.microbatch_size * job.model.seq_len
    capacity = sum(topology.bottleneck_bps(a, b) for a, b in plan.sharing)
    return plan, result, summarize(result.spans, plan.used_gpus(), 0.0, tokens, capacity)


@settings(max_examples=30)
@given(st.integers(2, 5), st.integers(1, 12), st.sampled_from(["gpipe", "1f1b"]))
def test_free_communication_matches_the_pipeline_bubble(stages: int, microbatches: int,
                                                        policy: str) -> None:
    model = ModelShape(layers=stages, hidden=8, heads=2, seq_len=4, vocab=16)
    job = Job(model, microbatches=microbatches, dp=1, pp=stages, iterations=3)
    profile = {s: {"forward_s": 1.0, "backward_s": 2.0} for s in range(stages)}
    _, _, summary = _run(_chain(stages), job, policy, profile)
    expected = microbatches / (microbatches + stages - 1)
    assert summary.utilization_training == pytest.approx(expected, rel=0.005)


def test_equal_flows_share_a_link_equally_and_one_flow_is_window_limited() -> None:
    queue = Agenda()
    capacity = {"link": 1e9, "a": 1e12, "b": 1e12}
    network = FluidNetwork(capacity, queue.at)
    arrivals: dict[str, float] = {}
    for name in ("x", "y", "z", "w"):
        pair = Pair(1, 1e9, 0.001, False, cwnd=1e9)  # huge window: not the limit
        network.start(0.0, 125e6, ("a", "link", "b"), pair, 0.0,
                      lambda t, n=name: arrivals.__setitem__(n, t))
    queue.run()
    # four flows of 1 Gbit each over a 1 Gbit/s link: each gets a quarter, all end at 4 s
    assert len(arrivals) == 4
    for end in arrivals.values():
        assert end == pytest.approx(4 / PAYLOAD_EFFICIENCY)

    window, rtt = 1e6, 0.1
    pair = Pair(1, window, rtt, False, cwnd=window)
    done: list[float] = []
    network.start(queue.now, 100e6, ("a", "link", "b"), pair, 0.0, done.append)
    start = queue.now
    queue.run()
    rate = 100e6 * 8 / (done[0] - start)
    assert rate == pytest.approx(window * 8 / rtt, rel=0.01)


def test_a_message_drawn_a_larger_share_takes_it_and_the_link_stays_full() -> None:
    """Share noise (testbed.plan.jitter): two equal messages weighing 1.2 and 0.8 share a
    link 60/40 until the first ends, then the second has it all."""
    queue = Agenda()
    network = FluidNetwork({"link": 1e9}, queue.at)
    arrivals: dict[float, float] = {}
    for share in (1.2, 0.8):
        pair = Pair(1, 1e9, 0.001, False, cwnd=1e9)
        network.start(0.0, 125e6, ("link",), pair, 0.0,
                      lambda t, s=share: arrivals.__setitem__(s, t), share=share)
    queue.run()
    rate = 1e9 * PAYLOAD_EFFICIENCY
    first = 1e9 / (0.6 * rate)
    assert arrivals[1.2] == pytest.approx(first)
    assert arrivals[0.8] == pytest.approx(2e9 / rate)  # the link never idled


def test_slow_start_sends_a_small_message_at_once_and_restarts_after_idle() -> None:
    queue = Agenda()
    network = FluidNetwork({"link": 1e9}, queue.at)
    pair = Pair(1, 4e6, 0.1, True)
    done: list[float] = []
    network.start(0.0, INITIAL_WINDOW / 2, ("link",), pair, 0.05, done.append)
    queue.run()
    assert done[0] == pytest.approx(0.05 + INITIAL_WINDOW / 2 * 8 / (1e9 * PAYLOAD_EFFICIENCY))
    network.start(queue.now, 8e6, ("link",), pair, 0.05, done.append)
    queue.run()
    grown = pair.cwnd
    assert grown > INITIAL_WINDOW
    queue.at(queue.now + 10.0, lambda t: None)
    queue.run()
    pair.begin(queue.now)
    assert pair.cwnd < grown  # halved per RTO of idle


def test_a_window_its_buffers_limit_restarts_from_twice_them_after_an_idle() -> None:
    """In slow start Linux grows a connection's window to twice what it keeps in flight
    where its buffers, not the window, limit it (tcp_is_cwnd_limited), and the restart
    after idle halves that window: two RTOs idle leave half the buffers' window, not a
    quarter (`ss -tin`: 5,812 segments, 2,889 in flight; 1,453 after the idle)."""
    queue = Agenda()
    network = FluidNetwork({"link": 10e9}, queue.at)
    window, rtt = 4e6, 0.06
    pair = Pair(1, window, rtt, True)
    done: list[float] = []
    network.start(0.0, 40e6, ("link",), pair, rtt / 2, done.append)
    queue.run()
    assert pair.cwnd == pytest.approx(CWND_OF_FLIGHT * window) and CWND_OF_FLIGHT == 2.0
    rto = RTO_MIN + rtt
    pair.begin(pair.last_active + 2.5 * rto)
    assert pair.cwnd == pytest.approx(window / 2)
    assert pair.round_budget() == pytest.approx(window / 2)


@given(st.dictionaries(st.integers(0, 20), st.tuples(
    st.floats(0.5, 8), st.sampled_from([1e6, 1e8, float("inf")]),
    st.lists(st.sampled_from(["r1", "r2", "r3"]), min_size=1, max_size=3, unique=True)),
    min_size=1, max_size=8))
def test_max_min_is_feasible_and_respects_caps(flows: dict[int, Any]) -> None:
    capacity = {"r1": 1e8, "r2": 5e7, "r3": 2e8}
    rates = max_min({k: (w, c, tuple(r)) for k, (w, c, r) in flows.items()}, capacity)
    for resource, cap in capacity.items():
        used = sum(rates[k] for k, (_, _, r) in flows.items() if resource in r)
        assert used <= cap * (1 + 1e-9)
    for k, (weight, cap, resources) in flows.items():
        assert rates[k] <= cap * (1 + 1e-9)
        assert rates[k] > 0
        # max-min fair: at its cap, or on a full resource where no user gets more per weight
        at_cap = rates[k] >= cap * (1 - 1e-9)
        bottlenecked = any(
            sum(rates[j] for j, (_, _, rs) in flows.items() if r in rs) >= capacity[r] * (1 - 1e-9)
            and all(rates[j] / w <= rates[k] / weight * (1 + 1e-9)
                    for j, (w, _, rs) in flows.items() if r in rs)
            for r in resources)
        assert at_cap or bottlenecked


def test_replicas_on_their_own_nics_share_a_link_as_one_group() -> None:
    """Flows alike but for a resource each has alone are solved as a group: the same
    rates as one by one, whatever their number."""
    capacity = {"wan": 1e9, **{f"nic{i}": 4e8 if i % 2 else 1e8 for i in range(6)}}
    flows = {i: (1.0, float("inf"), (f"nic{i}", "wan")) for i in range(6)}
    rates = max_min(flows, capacity)
    rest = (1e9 - 3 * 1e8) / 3  # the 1e8 NICs bind; the others split what is left
    assert [rates[i] for i in range(6)] == pytest.approx([1e8, rest] * 3)


def test_a_round_that_changes_no_rate_solves_nothing() -> None:
    """Two unpaced flows sharing a link in slow start: once their windows outgrow a round's
    share, their round boundaries reschedule only their own events (80 rounds here)."""
    queue = Agenda()
    network = FluidNetwork({"link": 1e9, "a": 1e10, "b": 1e10}, queue.at)
    solves: list[float] = []
    solve = network._solve

    def counted(now: float, resources: tuple[str, ...]) -> set[str]:
        solves.append(now)
        return solve(now, resources)

    network._solve = counted  # type: ignore[method-assign]
    done: list[float] = []
    for nic in ("a", "b"):
        network.start(0.0, 50e6, (nic, "link"), Pair(1, 4e6, 0.01, False), 0.0, done.append)
    queue.run()
    assert len(done) == 2
    assert done[1] == pytest.approx(100e6 * 8 / (1e9 * PAYLOAD_EFFICIENCY), rel=0.1)
    # while windows are under a round's share, each round pauses and resumes them (solved);
    # from ~0.08 s on (7 doublings) they send all round: nothing to solve until one ends
    assert [t for t in solves if 0.1 < t < done[0]] == []
    assert len(solves) < 20


def _end(topology: Any, job: Job, policy: str) -> float:
    """With equal shares (the default, asked for here): a drawn share (`--jitter share=`)
    holds whatever the network, so a faster one can leave a later message sharing a link
    with one it missed before, each at its own share, and end later: never slower is the
    fair-share model's property."""
    _, result, _ = _run(topology, job, policy, jitter=Jitter(share=0.0))
    return max(s["end"] for s in result.spans if s["kind"] == "step")


@settings(max_examples=25)
@given(data=st.data())
def test_more_bandwidth_or_less_latency_is_never_slower(data: st.DataObject) -> None:
    from dataclasses import replace

    topology = data.draw(topologies(min_dcs=2, max_dcs=3, max_gpus=3, full_mesh=True))
    # lossless links: on a lossy one the model places each loss exactly every 1/loss
    # packets, so the window a loss finds depends on the rate and the round trip, either
    # way (found: 1% loss, a quarter of the latency, 2.6% slower; the strict xfail
    # tests/test_tcp_model.py::test_a_slower_lossy_link_never_speeds_a_flow)
    topology = replace(topology, links=tuple(replace(link, loss=0.0)
                                             for link in topology.links))
    job = data.draw(job_fitting(topology))
    policy = data.draw(st.sampled_from(["gpipe", "1f1b", "dp-across-dc"]))
    try:
        base = _end(topology, job, policy)
    except InputError:
        assume(False)

    # every link 4x: with max-min sharing, a faster WAN link alone can slow a flow that
    # shares a host's NIC with one crossing it (the WAN flow takes more of the NIC: found
    # at 2e-5 of an iteration), so only all capacities growing together is never slower
    faster = replace(topology,
                     links=tuple(replace(link, bandwidth_bps=link.bandwidth_bps * 4)
                                 for link in topology.links),
                     datacenters=tuple(replace(dc, bandwidth_bps=dc.bandwidth_bps * 4)
                                       for dc in topology.datacenters))
    nearer = replace(topology, links=tuple(replace(link, latency_s=link.latency_s / 4)
                                           for link in topology.links))
    assert _end(faster, job, policy) <= base * (1 + 1e-9)
    assert _end(nearer, job, policy) <= base * (1 + 1e-9)


@pytest.mark.xfail(strict=True, reason=(
    "a round's bytes count against the window until the round's end: on the 4x faster "
    "network a gradient of 4 KB leaves just before the last round's acknowledgements come "
    "and waits a round trip (the hosts' floor, 10 us) that the slower one never waits: "
    "13.3 us an iteration there, 20.2 us here"))
def test_a_faster_network_is_never_slower_where_messages_outrun_one_window() -> None:
    """The example test_more_bandwidth_or_less_latency_is_never_slower found: two GPUs of
    one DC in 1F1B, messages of 4 KB, the round trip the hosts' floor (MIN_RTT_S)."""
    topology = parse_topology({
        "name": "t", "tcp": {"congestion": "cubic", "slow_start_after_idle": False,
                             "rmem": [4096, 131072, 1048576],
                             "wmem": [4096, 16384, 1048576]},
        "datacenters": [{"name": "east", "gpus": 2, "gpu": "a100", "bandwidth": "100Gbit",
                         "latency": "0s"},
                        {"name": "west", "gpus": 1, "gpu": "a100", "bandwidth": "100Mbit",
                         "latency": "0s"}],
        "wan": [{"between": ["east", "west"], "latency": "0.5ms", "bandwidth": "100Mbit"}],
    }, "t.yaml")
    job = Job(model=ModelShape(layers=4, hidden=16, heads=1, seq_len=64, vocab=32),
              microbatch_size=2, microbatches=11, tp=1, iterations=1, seed=0)
    from dataclasses import replace
    faster = replace(topology,
                     links=tuple(replace(link, bandwidth_bps=link.bandwidth_bps * 4)
                                 for link in topology.links),
                     datacenters=tuple(replace(dc, bandwidth_bps=dc.bandwidth_bps * 4)
                                       for dc in topology.datacenters))
    assert _end(faster, job, "1f1b") <= _end(topology, job, "1f1b") * (1 + 1e-9)


@settings(max_examples=25)
@given(data=st.data())
def test_trace_is_causal_and_gpus_do_one_thing_at_a_time(data: st.DataObject) -> None:
    topology = data.draw(topologies(min_dcs=1, max_dcs=3, max_gpus=3))
    job = data.draw(job_fitting(topology))
    policy = data.draw(st.sampled_from(["gpipe", "1f1b", "dp-across-dc"]))
    try:
        plan, result, _ = _run(topology, job, policy)
    except InputError:
        assume(False)
    compute: dict[str, list[tuple[float, float]]] = {}
    for span in result.spans:
        if span["kind"] in ("forward", "backward", "step"):
            compute.setdefault(span["gpu"], []).append((span["start"], span["end"]))
    for spans in compute.values():
        spans.sort()
        for (_, end), (start, _) in itertools.pairwise(spans):
            assert start >= end - 1e-12
    produced = {(s["gpu"], s["iteration"], s["microbatch"], s["kind"]): s["end"]
                for s in result.spans if s["kind"] in ("forward", "backward")}
    for span in result.spans:
        if span["kind"] == "transfer" and span.get("microbatch") is not None:
            src_stage = plan.worker_of(span["src"])[1]
            dst_stage = plan.worker_of(span["dst"])[1]
            kind = "forward" if dst_stage > src_stage else "backward"
            made = produced[(span["src"], span["iteration"], span["microbatch"], kind)]
            assert span["start"] >= made - 1e-12


def test_profile_from_spans_uses_medians_after_warmup() -> None:
    spans = [{"kind": "forward", "stage": 0, "iteration": i, "start": 0.0, "end": d}
             for i, d in ((0, 9.0), (1, 1.0), (2, 2.0), (3, 3.0))]
    assert profile_from_spans(spans) == {0: {"forward_s": 2.0}}


def _cli(args: list[str]) -> tuple[int, str, str]:
    from testbed.cli.main import main

    runner = CliRunner()
    with runner.isolation() as (out, err, _):
        try:
            main(args)
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue().decode(), err.getvalue().decode()


def test_simulate_writes_the_same_files_as_up(tmp_path: Path) -> None:
    code, _, err = _cli(["simulate", str(ROOT / "topologies" / "paper-3dc.yaml"), "-p",
                           "gpipe", "--out", str(tmp_path)])
    assert code == 0, err
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["backend"] == "simulate" and results["compute"] == "modeled"
    assert results["shaper"] is None
    assert results["iterations"] == 4 and results["iteration_time_s"]["median"] > 0
    assert (tmp_path / "trace.json.gz").exists() and (tmp_path / "spans.json").exists()
    code, _, err = _cli(["profile", str(tmp_path)])
    assert code == 0, err
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert set(profile["stages"]) == {"0", "1", "2"}
    code, _out, err = _cli(["simulate", str(ROOT / "topologies" / "paper-3dc.yaml"), "-p",
                           "gpipe", "--profile", str(tmp_path / "profile.json"), "--out",
                           str(tmp_path / "again")])
    assert code == 0, err


def test_sweep_writes_rows_and_a_plot(tmp_path: Path) -> None:
    code, _out, err = _cli(["sweep", str(ROOT / "topologies" / "paper-3dc.yaml"), "-p", "gpipe",
                           "-p", "1f1b", "--vary", "wan.latency=10ms,40ms", "--vary",
                           "microbatches=4,8", "--iterations", "2", "--out", str(tmp_path)])
    assert code == 0, err
    rows = list(csv.DictReader((tmp_path / "sweep.csv").open()))
    assert len(rows) == 8
    assert {r["policy"] for r in rows} == {"gpipe", "1f1b"}
    by_latency = {(r["policy"], r["wan.latency"], r["microbatches"]): float(r["iteration_s"])
                  for r in rows}
    assert by_latency[("gpipe", "10ms", "8")] < by_latency[("gpipe", "40ms", "8")]
    assert (tmp_path / "sweep.png").stat().st_size > 1000


def test_sweep_bad_vary_is_clear() -> None:
    code, _, err = _cli(["sweep", str(ROOT / "topologies" / "two-dc.yaml"), "--vary",
                         "wan.latency"])
    assert code == 2 and "expected KEY=V1,V2" in err


def test_microbatch_op_names_are_what_the_sim_reads() -> None:
    assert {Op.SEND_F.value, Op.SEND_B.value} == {"SEND_F", "SEND_B"}


def test_every_span_fits_the_schema_both_backends_share() -> None:
    topology = _chain(3, bandwidth="1Gbit", latency="5ms")
    model = ModelShape(layers=3, hidden=8, heads=2, seq_len=4, vocab=16)
    job = Job(model, microbatches=4, dp=1, pp=3, iterations=2)
    chosen = training_policy("1f1b")
    plan = plan_with_simulator(chosen, topology, job)
    event = parse_event_flag("at=0s,link=dc0-dc1,down=1ms", topology)
    spans = Simulator(topology, job, plan, chosen, events=[event]).run().spans
    assert {s["kind"] for s in spans} >= {"forward", "backward", "step", "send", "recv",
                                          "transfer", "net_event"}
    for span in spans:
        assert Span.__required_keys__ <= set(span) <= Span.__required_keys__ | \
            Span.__optional_keys__, span
        assert span["kind"] in get_args(SpanKind)
        assert ("stage" in span) == (span["kind"] != "net_event")


@pytest.mark.parametrize("policy", ["gpipe", "1f1b"])
def test_a_waited_send_completes_one_latency_after_its_transfer(policy: str) -> None:
    """torch's sends: a stage that waits on its send resumes when the receiving host's
    acknowledgement of the last byte is back, the transfer's end plus one path latency."""
    topology = _chain(3, bandwidth="200Mbit", latency="15ms")
    model = ModelShape(layers=3, hidden=256, heads=4, seq_len=256, vocab=64)
    job = Job(model, microbatches=5, dp=1, pp=3, iterations=2)
    profile = {s: {"forward_s": 0.01, "backward_s": 0.02} for s in range(3)}
    _, result, _ = _run(topology, job, policy, profile)
    ends = {(s["iteration"], s["src"], s["dst"], s["microbatch"]): s["end"]
            for s in result.spans if s["kind"] == "transfer"}
    waits = [s for s in result.spans if s["kind"] == "wait_send"]
    sends = [s for s in result.spans if s["kind"] == "send"]
    assert len(waits) == len(sends) > 0
    waited = [s for s in waits if s["end"] > s["start"]]
    assert waited, "nothing waited: the case does not test the mechanism"
    for span in waited:
        arrived = ends[(span["iteration"], span["gpu"], span["peer"], span["microbatch"])]
        assert span["end"] == pytest.approx(arrived + 0.015, abs=1e-9)
    for span in waits:  # never before the acknowledgement could be back
        arrived = ends[(span["iteration"], span["gpu"], span["peer"], span["microbatch"])]
        assert span["end"] >= arrived + 0.015 - 1e-9


def test_waiting_on_sends_slows_1f1b_where_transfers_outlast_compute() -> None:
    topology = _chain(3, bandwidth="200Mbit", latency="15ms")
    model = ModelShape(layers=3, hidden=256, heads=4, seq_len=256, vocab=64)
    job = Job(model, microbatches=6, dp=1, pp=3, iterations=3)
    times = {}
    for sends in ("torch", "eager"):
        chosen = training_policy("1f1b", {"sends": sends})
        plan = plan_with_simulator(chosen, topology, job)
        spans = Simulator(topology, job, plan, chosen).run().spans
        times[sends] = max(s["end"] for s in spans)
    assert times["torch"] > times["eager"]


@pytest.mark.usefixtures("shared_planning")
@pytest.mark.parametrize("name", ["paper-3dc", "wan-3dc"])
def test_planning_keeps_only_the_steps_and_times_iterations_as_a_full_run(name: str) -> None:
    """A planner's simulation keeps the optimizer steps' spans alone (a run keeps hundreds
    of thousands of others), and its iteration time is the full run's to the bit."""
    inputs = load_inputs(ROOT / "topologies" / f"{name}.yaml", sets=("iterations=3",))
    for policy_name in ("1f1b", "atlas"):
        policy = training_policy(policy_name)
        plan = plan_with_simulator(policy, inputs.topology, inputs.job)
        full = Simulator(inputs.topology, inputs.job, plan, policy).run()
        steps = Simulator(inputs.topology, inputs.job, plan, policy, spans=StepRows()).run()
        assert {s["kind"] for s in steps.spans} == {"step"}
        assert list(steps.spans) == [s for s in full.spans if s["kind"] == "step"]
        expected = run_iteration_s(full.spans, plan.used_gpus(), full.start, plan.period)
        assert simulated_iteration_s(inputs.topology, inputs.job, plan, policy) == expected


def test_a_run_told_where_to_stop_stops_there_with_a_true_bound() -> None:
    inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml", sets=("iterations=3",))
    policy = training_policy("1f1b")
    plan = plan_with_simulator(policy, inputs.topology, inputs.job)
    exact = simulated_iteration_s(inputs.topology, inputs.job, plan, policy)
    assert exact is not None
    assert simulated_iteration_s(inputs.topology, inputs.job, plan, policy, exact * 1.01) == exact
    bound = simulated_iteration_s(inputs.topology, inputs.job, plan, policy, exact * 0.9)
    assert bound is not None and exact * 0.9 < bound <= exact
    result = Simulator(inputs.topology, inputs.job, plan, policy, stop_above=exact * 0.9).run()
    assert result.stopped_at is not None and result.median_at_least == bound
    assert min(s["start"] for s in result.spans if s["kind"] == "step") < result.stopped_at


def _spans_run(directory: Path, span: dict[str, object], results: str | None = None) -> Path:
    spans = [{"gpu": "east-0", "kind": "forward", "stage": 0, "iteration": i, "start": 0.0,
              "end": 1.0} for i in range(3)]
    spans[2] = {**spans[2], **span}
    directory.mkdir()
    (directory / "spans.json").write_text(
        json.dumps({"start": 0.0, "spans": spans}).replace('"NAN"', "NaN"))
    if results is not None:
        (directory / "results.json").write_text(results)
    return directory


@pytest.mark.parametrize(("span", "results", "expected"), [
    ({"stage": "x"}, None, "spans.json: spans[2].stage: expected integer, got str"),
    ({"end": "NAN"}, None, "spans.json: spans[2].end: expected number, got nan"),
    ({"end": -1.0}, None, "spans.json: spans[2].end: ends (-1.0) before it starts (0.0)"),
    ({}, "{not json", "results.json: unreadable: Expecting property name"),
    ({}, '{"compute": 3, "topology": null, "policy": "gpipe"}',
     "results.json: compute: expected text or null, got int"),
])
def test_profile_of_a_damaged_run_is_one_line_exit_2(
        tmp_path: Path, span: dict[str, object], results: str | None, expected: str) -> None:
    run = _spans_run(tmp_path / "run", span, results)
    code, _, err = _cli(["profile", str(run)])
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], err
    assert str(run) in lines[0]
    assert not (run / "profile.json").exists()


def test_results_files_are_strict_json_a_nan_loss_is_null(tmp_path: Path) -> None:
    """A diverged model's loss is NaN; results.json holds null, which every reader takes."""
    from dataclasses import replace

    from testbed import api
    from testbed.report.results import write_run
    from testbed.report.results_schema import check_results

    result = api.simulate(api.load(ROOT / "topologies" / "two-dc.yaml"), "gpipe",
                          out=tmp_path / "run")
    record = replace(result.record, losses={0: 2.5, 1: float("nan"), 2: float("inf")},
                     start=float("nan"))
    write_run(tmp_path / "nan", record)

    def refuse(constant: str) -> float:
        raise AssertionError(f"{constant} in a results file")

    for name in ("results.json", "spans.json"):
        json.loads((tmp_path / "nan" / name).read_text(), parse_constant=refuse)
    json.loads(gzip.decompress((tmp_path / "nan" / "trace.json.gz").read_bytes()),
               parse_constant=refuse)
    results = json.loads((tmp_path / "nan" / "results.json").read_text())
    assert results["loss"] == {"0": 2.5, "1": None, "2": None}
    check_results(results, "results.json")  # the schema takes the null


@pytest.mark.parametrize(("topology", "policy", "sets", "events", "jitter"), [
    ("gpt3-4dc", "1f1b", ("iterations=1",), (), None),
    ("paper-3dc", "1f1b", (), ("at=20s,link=east-central,down=5s",
                               "at=40s,link=central-west,latency=60ms,for=30s",
                               "at=50s,link=east-central,bandwidth=300Mbit"), None),
    ("wan-3dc", "gpipe", (), (), "compute=10%,network=10%"),
    ("paper-3dc", "diloco", ("iterations=4",), (), None),
    ("two-dc", "1f1b", ("iterations=6",), (), None),
])
def test_plain_rounds_run_without_events_to_the_same_spans(
        topology: str, policy: str, sets: tuple[str, ...], events: tuple[str, ...],
        jitter: str | None) -> None:
    """Slow-start rounds that change nothing but the window run without events of their
    own (FluidNetwork.coast): every span to the bit as with an event per round, under
    outages, latency and bandwidth changes and noise, in fewer events."""
    from testbed.plan.jitter import parse_jitter

    inputs = load_inputs(ROOT / "topologies" / f"{topology}.yaml", sets=sets, events=events)
    chosen = training_policy(policy)
    plan = plan_with_simulator(chosen, inputs.topology, inputs.job)
    runs = []
    for coast in (False, True):
        simulator = Simulator(inputs.topology, inputs.job, plan, chosen, events=inputs.events,
                              jitter=parse_jitter(jitter).with_seed(1) if jitter else None)
        simulator.network.coast = coast
        result = simulator.run()
        runs.append((result.events, [json.dumps(s, sort_keys=True) for s in result.spans]))
    (every_round, spans), (coasting, same) = runs
    assert same == spans
    assert coasting <= every_round
    if policy == "1f1b" and topology != "two-dc":  # replicas share WAN links: plain rounds
        assert coasting < every_round
