"""The flow model's TCP against what real TCP does: shares biased by round trip per
congestion control, random loss answered as the congestion control answers it, the window
the workers' transport keeps in flight. Properties: shares fill the bottleneck; under
loss-based control the shorter round trip never gets less; loss never speeds a flow."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.plan.tcp_model import (
    MSS,
    PAYLOAD_EFFICIENCY,
    RTT_BIAS,
    in_flight_bytes,
    loss_response,
)
from testbed.sim.agenda import Agenda
from testbed.sim.flows import pair_between
from testbed.sim.network import FluidNetwork
from testbed.sim.one_transfer import one_transfer_s, shared_rates
from testbed.topology import parse_topology
from testbed.topology.model import TcpSettings

LOSS_BASED = ("cubic", "reno")


def _hub(rtts_ms: list[float], congestion: str, rate: str = "200Mbit") -> Any:
    """Sources s0.. reach dst through hub; hub-dst (2 ms one way) is the bottleneck."""
    dcs = [{"name": f"s{i}", "gpus": 1} for i in range(len(rtts_ms))]
    dcs += [{"name": "hub", "gpus": 1}, {"name": "dst", "gpus": 1}]
    wan = [{"between": [f"s{i}", "hub"], "latency": f"{rtt / 2 - 2:g}ms", "bandwidth": "10Gbit"}
           for i, rtt in enumerate(rtts_ms)]
    wan.append({"between": ["hub", "dst"], "latency": "2ms", "bandwidth": rate})
    return parse_topology({"tcp": {"congestion": congestion}, "datacenters": dcs, "wan": wan},
                          "hub.yaml")


def _link(congestion: str, loss: float, rtt_ms: float = 50.0, rate: str = "1Gbit") -> Any:
    return parse_topology({
        "tcp": {"congestion": congestion},
        "datacenters": [{"name": "east", "gpus": 1}, {"name": "west", "gpus": 1}],
        "wan": [{"between": ["east", "west"], "latency": f"{rtt_ms / 2:g}ms",
                 "bandwidth": rate, "loss": loss}]}, "link.yaml")


def _shares(rtts_ms: list[float], congestion: str, paced: bool | None = None) -> list[float]:
    topology = _hub(rtts_ms, congestion)
    return shared_rates(topology, [f"s{i}" for i in range(len(rtts_ms))], "dst", 20.0, 30.0,
                        paced)


@pytest.mark.parametrize("congestion", ["cubic", "bbr", "reno"])
@pytest.mark.parametrize("paced", [False, True])
def test_two_round_trips_share_as_the_congestion_control_biases_them(congestion: str,
                                                                     paced: bool) -> None:
    """20 and 100 ms on 200 Mbit/s: the shorter gets 5^a times the longer, a per
    congestion control and pacing (RTT_BIAS), and together they fill the link."""
    short, long = _shares([20.0, 100.0], congestion, paced)
    assert short / long == pytest.approx(5 ** RTT_BIAS[(congestion, paced)], rel=1e-5)
    assert short + long == pytest.approx(200e6 * PAYLOAD_EFFICIENCY, rel=1e-6)


@settings(max_examples=30, deadline=None)
@given(rtts=st.lists(st.integers(6, 300).map(float), min_size=1, max_size=6),
       congestion=st.sampled_from(["cubic", "bbr", "reno"]))
def test_shares_fill_the_bottleneck(rtts: list[float], congestion: str) -> None:
    rates = _shares(rtts, congestion)
    windows = [in_flight_bytes(TcpSettings(congestion), TcpSettings(congestion)) * 8 / (r / 1e3)
               for r in rtts]
    if all(rate < cap * (1 - 1e-6) for rate, cap in zip(rates, windows, strict=True)):
        assert sum(rates) == pytest.approx(200e6 * PAYLOAD_EFFICIENCY, rel=1e-6)
    else:  # a window binds: the link may be left part idle, never overfilled
        assert sum(rates) <= 200e6 * PAYLOAD_EFFICIENCY * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(rtts=st.lists(st.integers(6, 300).map(float), min_size=2, max_size=6),
       congestion=st.sampled_from(LOSS_BASED))
def test_under_loss_based_control_the_shorter_round_trip_never_gets_less(
        rtts: list[float], congestion: str) -> None:
    rates = _shares(rtts, congestion)
    for (rtt_a, rate_a), (rtt_b, rate_b) in zip(sorted(zip(rtts, rates, strict=True)),
                                                sorted(zip(rtts, rates, strict=True))[1:],
                                                strict=False):
        assert rtt_a > rtt_b or rate_a >= rate_b * (1 - 1e-9)


@settings(max_examples=40, deadline=None)
@given(congestion=st.sampled_from(["cubic", "bbr", "reno"]),
       loss=st.sampled_from([1e-5, 1e-4, 1e-3, 1e-2, 5e-2]),
       connections=st.sampled_from([1, 2, 4, 16]),
       megabytes=st.sampled_from([0.1, 1.0, 20.0]),
       rtt_ms=st.sampled_from([2.0, 20.0, 100.0]))
def test_loss_never_speeds_a_flow(congestion: str, loss: float, connections: int,
                                  megabytes: float, rtt_ms: float) -> None:
    size = int(megabytes * 1e6)
    clean = one_transfer_s(_link(congestion, 0.0, rtt_ms), "east", "west", size, connections,
                           False)
    lossy = one_transfer_s(_link(congestion, loss, rtt_ms), "east", "west", size, connections,
                           False)
    assert lossy >= clean


@pytest.mark.parametrize("congestion", LOSS_BASED)
def test_a_long_lossy_flow_settles_near_its_response_function(congestion: str) -> None:
    """Loss-based control at 0.1% on a fast link: the mean path's steady rate is
    Mathis et al.'s MSS/RTT x sqrt(3/2)/sqrt(p) within a factor the window's growth
    between losses explains (CUBIC's is the faster, so it may sit above)."""
    topology = _link(congestion, 1e-3, 50.0, "10Gbit")
    seconds = one_transfer_s(topology, "east", "west", 200_000_000, 1, False)
    mathis = MSS * 8 / 0.05 * math.sqrt(1.5) / math.sqrt(1e-3)
    rate = 200e6 * 8 / seconds
    assert 0.7 * mathis <= rate <= (3.0 if congestion == "cubic" else 1.3) * mathis


def test_loss_on_a_topology_slows_a_run_s_transfers() -> None:
    """The simulator reads loss from the topology (it ignored it before): 0.1% on a
    CUBIC link makes a 20 MB transfer several times slower; BBR's window ignores it and
    only the tail's repair shows."""
    size = 20_000_000
    cubic = [one_transfer_s(_link("cubic", loss), "east", "west", size, 1, False)
             for loss in (0.0, 1e-3)]
    bbr = [one_transfer_s(_link("bbr", loss), "east", "west", size, 1, False)
           for loss in (0.0, 1e-3)]
    assert cubic[1] > 3 * cubic[0]
    assert bbr[0] < bbr[1] < bbr[0] + 2 * 0.05 + 1e-9


def test_a_loss_event_changes_a_pairs_next_messages() -> None:
    """A run's link loss reaches each pair's next message (Transfers.pair)."""
    topology = _link("cubic", 0.0)
    agenda = Agenda()
    network = FluidNetwork({"wan": 1e9}, agenda.at)
    pair = pair_between(topology, "east", "west", 1, 0.05, 20e6)
    assert not pair.lossy and loss_response("cubic") is not None
    pair.set_loss(1e-2)
    assert pair.lossy
    done: list[float] = []
    network.start(0.0, 20e6, ("wan",), pair, 0.025, done.append)
    agenda.run()
    clean = one_transfer_s(topology, "east", "west", 20_000_000, 1, False)
    assert done[0] > 3 * clean


def test_one_long_flow_keeps_what_the_transport_keeps_in_flight() -> None:
    """Linux's default buffers (4 MiB to send, 6 MiB to receive): the transport keeps
    0.71 of the send buffer in flight (measured with ss, see WINDOW_EFFICIENCY), so 200 MB
    at 100 ms RTT take about 200e6 / (0.71 x 4 MiB / 0.1 s) plus slow start."""
    window = in_flight_bytes(TcpSettings(), TcpSettings())
    assert window == pytest.approx(0.71 * 4 * 2**20)
    seconds = one_transfer_s(_link("cubic", 0.0, 100.0), "east", "west", 200_000_000, 1, False)
    steady = 200e6 / (window / 0.1)
    assert steady < seconds < steady + 1.0


ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "benchmarks" / "peers-emulator.json"


def _recorded(part: str) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = json.loads(RECORDED.read_text())[part]
    return entries


UNDERFILLED = pytest.mark.xfail(
    strict=True, reason="the emulator's unpaced Reno leaves a tenth of the link idle (its "
    "halved windows drain the small drop-tail queue), the model fills it: 172 Mbit/s "
    "against 155 for the 20 ms flow")


@pytest.mark.parametrize("entry", [
    pytest.param(e, marks=UNDERFILLED) if e["case"] == "two-reno-unpaced" else e
    for e in _recorded("shares") if len(e["rtts_ms"]) == 2], ids=lambda e: e["case"])
def test_two_flows_share_within_ten_percent_of_the_emulators_runs(entry: dict[str, Any]) -> None:
    """The recorded emulator runs (real Linux TCP, benchmarks/peers-emulator.json): each
    flow's simulated share within 10% of their median."""
    topology = _hub(entry["rtts_ms"], entry["congestion"])
    simulated = shared_rates(topology, ["s0", "s1"], "dst", 5.0, 20.0, entry["paced"])
    for i, rate in enumerate(simulated):
        median = statistics.median(run["mbps"][i] for run in entry["runs"])
        assert rate / 1e6 == pytest.approx(median, rel=0.10), (entry["case"], i)


@pytest.mark.benchmark
def test_bench_peers_compares_the_recorded_runs(tmp_path: Path) -> None:
    """The benchmark end to end on the recorded emulator runs, without ns-3 (minutes) and
    with 100 flows: every table renders from its output."""
    out = tmp_path / "peers.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "bench_peers.py"), "--from-emulator",
                    str(RECORDED), "--no-ns3", "--scale", "100", "--json", str(out)],
                   check=True, capture_output=True, text=True, timeout=1800)
    report = json.loads(out.read_text())
    sys.path.insert(0, str(ROOT / "scripts"))
    import measured_tables

    for table in ("peers_shares", "peers_loss", "peers_long", "peers_scale", "peers_inflight"):
        assert getattr(measured_tables, table)(report).count("\n") >= 2
