"""Time dilation: the arithmetic, and represented figures that do not depend on K."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.common.spans import Span
from testbed.emulator.runtime.coordinator.health import (
    CpuSample,
    assess,
    assess_run,
    delay_line_lateness,
    suggest_dilation,
)
from testbed.errors import InputError
from testbed.experiments.planning import plan_with_simulator
from testbed.job.model import InferenceWorkload, Job, ModelShape
from testbed.plan import tcp_model
from testbed.policy import training_policy
from testbed.run.dilation import (
    LINUX_RTO_MIN_S,
    MAX_DILATION,
    MIN_USABLE,
    PATH_LIMIT,
    MachineLoad,
    WorkerCosts,
    busiest_spans_per_second,
    choose_dilation,
    choose_for,
    dilate_event,
    dilate_job,
    dilate_topology,
    peak_rate_bps,
    represented_inference,
    represented_spans,
    spans_per_second,
    usable_share,
)
from testbed.run.spec import parse_dilation
from testbed.sim.flows import MIN_RTT_S
from testbed.sim.one_transfer import one_transfer_s
from testbed.sim.simulator import Simulator
from testbed.topology import load_topology, parse_topology
from testbed.topology.model import Topology
from testbed.topology.net_events import NetEvent

from .conftest import TOPOLOGIES
from .strategies import job_fitting, topologies

factors = st.sampled_from([1, 2, 3, 4, 7, 16])


@given(topologies(), factors)
def test_dilated_links_keep_bytes_and_stretch_time(topology, k: int) -> None:  # type: ignore[no-untyped-def]
    dilated = dilate_topology(topology, k)
    for before, after in zip(topology.links, dilated.links, strict=True):
        assert math.isclose(after.bandwidth_bps * k, before.bandwidth_bps)
        assert math.isclose(after.latency_s, before.latency_s * k)
        assert math.isclose(after.jitter_s, before.jitter_s * k)
        assert abs(after.effective_queue_bytes - before.effective_queue_bytes) <= 1
        assert abs(after.bdp_bytes - before.bdp_bytes) <= 1
    for before_dc, after_dc in zip(topology.datacenters, dilated.datacenters, strict=True):
        assert math.isclose(after_dc.gpu.sustained_flops * k, before_dc.gpu.sustained_flops)
        assert after_dc.gpu.memory_bytes == before_dc.gpu.memory_bytes
        rto = dilated.tcp_for(after_dc.name).rto_min_s
        assert rto is None if k == 1 else math.isclose(rto or 0, LINUX_RTO_MIN_S * k)
    assert dilated.tcp.window_bytes == topology.tcp.window_bytes


def _above_the_rtt_floor(topology: Topology) -> Topology:
    """Latencies lifted to the hosts' round-trip floor, and no loss where CUBIC sends:
    its growth after a loss follows seconds, not round trips (RFC 8312), in the real
    stack as in the model, so a dilated CUBIC regains its window sooner."""
    least = MIN_RTT_S / 2
    cubic = any(tcp.congestion == "cubic" for tcp in
                (topology.tcp, *(dc.tcp for dc in topology.datacenters if dc.tcp)))
    return dataclasses.replace(
        topology,
        datacenters=tuple(dataclasses.replace(dc, latency_s=max(dc.latency_s, least))
                          for dc in topology.datacenters),
        links=tuple(dataclasses.replace(link, latency_s=max(link.latency_s, least),
                                        loss=0.0 if cubic else link.loss)
                    for link in topology.links))


@settings(max_examples=30)
@given(st.data(), topologies(max_dcs=3, max_gpus=3), st.sampled_from([2, 4, 5]))
def test_simulated_figures_are_invariant_in_k(data, topology, k: int) -> None:  # type: ignore[no-untyped-def]
    """The simulator of a dilated network, converted back, says what the undilated one
    says: every duration scales by K and nothing else changes. Above the hosts' round-trip
    floor, that is (MIN_RTT_S, which dilation does not slow): latencies are lifted to it;
    without CUBIC's losses (_above_the_rtt_floor); and with a connection's window one
    share of its buffers at every rate: between 1 and 10 Gbit/s the real stack keeps less
    of them in flight on a slower link, so on a dilated one too (window_efficiency;
    test_a_dilated_fast_path_keeps_the_slower_rates_window)."""
    topology = _above_the_rtt_floor(topology)
    job = data.draw(job_fitting(topology))
    policy = training_policy(data.draw(st.sampled_from(["gpipe", "1f1b"])))
    plan = plan_with_simulator(policy, topology, job)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tcp_model, "WINDOW_EFFICIENCY_BY_RATE",
                      ((1e9, tcp_model.WINDOW_EFFICIENCY),))
        plain = Simulator(topology, job, plan, policy).run()
        slow = Simulator(dilate_topology(topology, k), job, plan, policy).run()
    ends = sorted(s["end"] for s in plain.spans)
    slow_ends = sorted(s["end"] for s in represented_spans(slow.spans, slow.start, k))
    assert len(ends) == len(slow_ends)
    for a, b in zip(ends, slow_ends, strict=True):
        assert b == pytest.approx(a, rel=1e-6, abs=1e-5)


def test_a_dilated_fast_path_keeps_the_slower_rates_window() -> None:
    """A window-limited connection keeps a rate-dependent share of its buffers in flight
    (window_efficiency): on a 4 Gbit/s link dilated by 4 the emulator's links run at
    1 Gbit/s, and the simulator of the dilated network gives the 1 Gbit/s share, so its
    transfer takes longer than K times the undilated one's, by the ratio of the shares."""
    topology = parse_topology({
        "name": "fast", "datacenters": [{"name": "east", "gpus": 1}, {"name": "west", "gpus": 1}],
        "wan": [{"between": ["east", "west"], "latency": "30ms", "bandwidth": "4Gbit"}]})
    size = 200 * 10**6
    plain = one_transfer_s(topology, "east", "west", size, 1, warm=True)
    slow = one_transfer_s(dilate_topology(topology, 4), "east", "west", size, 1, warm=True)
    shares = tcp_model.window_efficiency(4e9) / tcp_model.window_efficiency(1e9)
    assert shares > 1.2
    latency = 0.03
    assert (slow / 4 - latency) / (plain - latency) == pytest.approx(shares, rel=0.01)


@pytest.mark.usefixtures("shared_planning")
def test_paper_topology_with_idle_restarts_is_invariant() -> None:
    """Slow start after idle depends on the minimum RTO, which dilation stretches too."""
    topology = load_topology(TOPOLOGIES / "paper-3dc.yaml")
    assert topology.tcp.slow_start_after_idle
    from testbed.job.load import load_job

    job = load_job(topology.job, topology.source, None, ["iterations=2"])
    policy = training_policy("atlas")
    plan = plan_with_simulator(policy, topology, job)
    plain = Simulator(topology, job, plan, policy).run()
    slow = Simulator(dilate_topology(topology, 4), job, plan, policy).run()
    assert max(s["end"] for s in slow.spans) - slow.start == pytest.approx(
        4 * (max(s["end"] for s in plain.spans) - plain.start), rel=1e-6)


def test_events_and_inference_stretch() -> None:
    event = NetEvent(10.0, "a", "b", "bandwidth", 1e9, 5.0)
    assert dilate_event(event, 4) == NetEvent(40.0, "a", "b", "bandwidth", 2.5e8, 20.0)
    latency = NetEvent(1.0, "a", "b", "latency", 0.02, None)
    assert dilate_event(latency, 2) == NetEvent(2.0, "a", "b", "latency", 0.04, None)
    workload = InferenceWorkload(ModelShape(2, 16, 2, 16, 32), 40.0, deadline_s=5.0,
                                 trace=((0.5, 64), (1.0, 128)))
    job = dilate_job(Job(model=ModelShape(2, 16, 2, 16, 32), inference=workload), 4)
    assert job.inference is not None
    assert job.inference.arrival_rate == 10.0 and job.inference.deadline_s == 20.0
    assert job.inference.trace == ((2.0, 64), (4.0, 128))
    block = {"served": 3, "ttft_s": {"p50": 4.0, "p99": None},
             "dedicated": {"gpus": 1, "ttft_s": {"p50": 2.0, "p99": 8.0}}}
    assert represented_inference(block, 4) == {
        "served": 3, "ttft_s": {"p50": 1.0, "p99": None},
        "dedicated": {"gpus": 1, "ttft_s": {"p50": 0.5, "p99": 2.0}}}


def test_represented_spans_divide_offsets() -> None:
    spans = [{"kind": "recv", "start": 110.0, "end": 130.0, "waited": 8.0}]
    assert represented_spans(spans, 100.0, 4) == [
        {"kind": "recv", "start": 102.5, "end": 107.5, "waited": 2.0}]
    assert represented_spans(spans, 100.0, 1) == spans


def test_peak_rate_and_choice() -> None:
    spans = [
        {"kind": "transfer", "start": 0.0, "end": 1.0, "bytes": 125_000_000, "link": "a>b"},
        {"kind": "transfer", "start": 0.5, "end": 1.5, "bytes": 125_000_000, "link": "b>a"},
        {"kind": "transfer", "start": 0.0, "end": 0.1, "bytes": 125_000_000, "link": None},
        {"kind": "transfer", "start": 0.0, "end": 0.1, "bytes": 125_000_000, "link": None,
         "modeled": True},
    ]
    assert peak_rate_bps(spans) == pytest.approx(2e9)
    assert peak_rate_bps(spans, wan_only=False) == pytest.approx(11e9)
    assert choose_dilation(2e9, 4e9) == 1
    assert choose_dilation(2e9, 3e9) == 2
    assert choose_dilation(11e9, 3e9) == 8
    assert choose_dilation(0.0, 3e9) == 1


def test_auto_weighs_the_workers_cpu_as_well_as_the_bytes() -> None:
    """(forwarding + bookkeeping) / K + upkeep <= half the machine: the 120-GPU run that
    took 26x its simulated time forwarded little; its workers' actions and upkeep did."""
    costs = WorkerCosts(span_cpu_s=80e-6, idle_cpu=0.007)
    load = MachineLoad(peak_bps=0.4e9, capacity_bps=1.6e9, spans_per_s=60_000, workers=120,
                       cores=2, costs=costs)
    assert load.forwarding == pytest.approx(0.25)
    assert load.bookkeeping == pytest.approx(2.4)  # 60,000 x 80 us over 2 cores
    assert load.upkeep == pytest.approx(0.42)
    assert choose_dilation(load.peak_bps, load.capacity_bps) == 1  # bytes alone
    assert choose_for(load) == math.ceil(2.65 / 0.08)  # 34
    assert choose_dilation(1e9, 2e9, bookkeeping=0.5) == 2
    assert choose_dilation(1e9, 2e9, bookkeeping=0.5, upkeep=0.25) == 4
    assert choose_dilation(1e9, 2e9, upkeep=0.5) == MAX_DILATION  # no dilation helps


def test_a_busy_machine_leaves_a_run_less_of_itself() -> None:
    """Half of what the machine's other work leaves: all of it on an idle machine."""
    assert usable_share(0.0) == 0.5
    assert usable_share(0.4) == pytest.approx(0.3)
    assert usable_share(1.0) == usable_share(1.3) == MIN_USABLE
    load = MachineLoad(1e9, 2e9, 0.0, 4, 2, WorkerCosts(1e-4, 0.0))
    assert choose_for(load, usable_share(0.0)) == 1
    assert choose_for(load, usable_share(0.4)) == 2


def test_spans_per_second_of_a_simulated_run() -> None:
    spans = [_span("forward", 0.0, 1.0), _span("send", 1.0, 2.0), _span("recv", 3.0, 4.0),
             _span("net_event", 0.0, 100.0)]
    assert spans_per_second(spans) == pytest.approx(3 / 4)
    assert spans_per_second([]) == 0.0


def _span(kind: str, start: float, end: float, gpu: str = "a-0") -> Span:
    return {"gpu": gpu, "kind": kind, "start": start, "end": end, "iteration": 0,
            "stage": 0}  # type: ignore[typeddict-item]


def test_the_busiest_worker_sets_the_share_its_actions_take_of_its_path() -> None:
    """two-dc's pipelines: 26 spans per worker per iteration of 41.5 ms at 119 us of CPU
    each take 7.5% of the worker's time, which dilation 4 brings under 2%; the machine's
    idle cores do not help (no forwarding or bookkeeping to speak of)."""
    spans = [_span("forward", 0.0, 1.0, "a-0"), _span("send", 1.0, 2.0, "a-0"),
             _span("recv", 3.0, 4.0, "b-0"), _span("net_event", 0.0, 100.0, "network")]
    assert busiest_spans_per_second(spans) == pytest.approx(2 / 4)
    assert busiest_spans_per_second([]) == 0.0
    load = MachineLoad(peak_bps=1e6, capacity_bps=2e9, spans_per_s=4 * 26 / 0.0415,
                       workers=4, cores=2, costs=WorkerCosts(119e-6, 0.0),
                       busiest_spans_per_s=26 / 0.0415)
    assert load.path == pytest.approx(0.0746, rel=1e-3)
    assert choose_for(load) == math.ceil(load.path / PATH_LIMIT) == 4
    assert choose_dilation(1e6, 2e9) == 1  # without the path, bytes alone
    assert choose_dilation(0.0, 2e9, path=0.01) == 1
    assert choose_dilation(0.0, 2e9, path=PATH_LIMIT * 100) == MAX_DILATION
    assert choose_dilation(3e9, 1e9, path=0.05) == 6  # the busier of the two needs wins


def test_a_worker_whose_own_actions_take_its_path_bounds_the_run() -> None:
    """However idle the cores: the run says so, and suggests the dilation that brings
    the busiest worker's share under PATH_LIMIT (it is already the run's own, at K)."""
    health = assess(0.1, [0.0002], None, dilation=1, path_share=0.075)
    assert health.cpu_bound and health.suggested_dilation == 4
    assert "busiest worker's own actions took 7.5% of its time" in (health.warning() or "")
    dilated = assess(0.1, [0.0002], None, dilation=4, path_share=0.019)
    assert not dilated.cpu_bound and dilated.suggested_dilation == 4
    assert assess(0.1, [0.0002], None, dilation=2, path_share=0.03).suggested_dilation == 3
    unmeasured = assess(0.1, [0.0002], None, path_share=None)
    assert not unmeasured.cpu_bound and unmeasured.path_share is None
    # behind the simulator too: the larger of the two needs
    assert health.behind(1.1, 1.0).suggested_dilation == 4


def test_after_a_machine_bound_run_the_suggestion_covers_what_it_needed() -> None:
    """A run 26 times slower than the simulator with its cores saturated needs about 26
    times the time: aiming at 60% busy, dilation 44, not 2."""
    assert suggest_dilation(1, 1.0, 26.0) == 44
    assert suggest_dilation(1, 0.95) == 2  # kept pace, just: one more
    assert suggest_dilation(4, 0.9, 0.98) == 6


def test_a_machine_bound_run_suggests_what_it_needed_whichever_way_it_ran() -> None:
    """One run or segments of one (a scenario's failures): the suggestion weighs how far
    its iterations fell behind the simulator's, where both are known."""
    busy = assess(1.0, [0.001], None, dilation=1)
    assert busy.cpu_bound and busy.suggested_dilation == 2
    assert busy.behind(26.0, 1.0).suggested_dilation == 44
    assert busy.behind(None, 1.0) == busy and busy.behind(26.0, None) == busy
    calm = assess(0.5, [0.001], None)
    assert calm.behind(26.0, 1.0) == calm


@pytest.mark.parametrize("text", ["0", "-2", "x", "1.5", "65", ""])
def test_bad_dilation_is_an_input_error(text: str) -> None:
    with pytest.raises(InputError, match="--dilation"):
        parse_dilation(text)


def test_dilation_values() -> None:
    assert parse_dilation("auto") == "auto"
    assert parse_dilation("4") == 4


def test_health_names_what_bound_the_run() -> None:
    calm = assess(0.5, [0.001, 0.002], (0.0001, 0.001))
    assert not calm.cpu_bound and calm.warning() is None and calm.suggested_dilation == 1
    busy = assess(0.95, [0.001], None, dilation=2)
    assert busy.cpu_bound and busy.suggested_dilation == 4
    assert "--dilation 4" in (busy.warning() or "")
    late = assess(0.5, [0.0] * 98 + [0.04, 0.04], None, dilation=2)
    assert late.cpu_bound and late.lag_p99_s == pytest.approx(0.02)
    stats = {"ab": {"ports": {"x": {"packets_out": 10, "late_mean_ms": 2.0, "late_max_ms": 5.0},
                              "y": {"packets_out": 30, "late_mean_ms": 0.0, "late_max_ms": 1.0}}}}
    assert delay_line_lateness(stats) == pytest.approx((0.0005, 0.005))
    assert delay_line_lateness({}) is None


def test_a_runs_health_reads_its_cpu_samples_and_the_workers_ticks() -> None:
    """Over 1000 ticks of all cores, 700 busy, the workers' 300 ticks for 150 spans."""
    tick_s = 1 / os.sysconf("SC_CLK_TCK")
    health = assess_run(CpuSample(100, 1000), CpuSample(800, 2000), 300, 150, [0.001],
                        None, dilation=2)
    assert health.cpu_busy == pytest.approx(0.7) and health.workers_cpu == pytest.approx(0.3)
    assert health.span_cpu_s == pytest.approx(2 * tick_s)
    unmeasured = assess_run(CpuSample(0, 0), CpuSample(0, 0), None, 0, [], None, 1)
    assert unmeasured.workers_cpu is None and unmeasured.span_cpu_s is None
    assert unmeasured.path_share is None
    # its busiest worker recorded 100 spans a second of the machine's time, each costing
    # 200 us as calibrated (not the run's own 2 ticks: its bytes' writes are in those)
    pathed = assess_run(CpuSample(100, 1000), CpuSample(800, 2000), 300, 150, [0.001],
                        None, dilation=2, busiest_spans_per_s=100.0, action_cpu_s=2e-4)
    assert pathed.path_share == pytest.approx(0.02) and pathed.cpu_bound
    assert pathed.suggested_dilation == 3  # 2 x 2% / 2%, and at least one more


def test_the_workers_cpu_is_measured_once_and_cached(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The calibration runs the workers' own data plane (stage runners, transports, the
    control protocol) on this machine; the figures are kept beside the forwarding
    capacity, per kernel and core count."""
    from testbed.emulator.runtime.coordinator import capacity

    monkeypatch.setenv("TESTBED_CAPACITY_DIR", str(tmp_path))
    said: list[str] = []
    costs = capacity.worker_costs(said.append)
    assert len(said) == 1 and "measuring" in said[0]
    assert 1e-6 < costs.span_cpu_s < 5e-3
    assert 0 < costs.idle_cpu < 0.2
    assert capacity.worker_costs(said.append) == costs and len(said) == 1
    cached = json.loads((tmp_path / "capacity.json").read_text())
    assert cached["span_cpu_s"] == costs.span_cpu_s and "bps" not in cached


def test_the_capacity_cache_has_a_variable_of_its_own(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """`TESTBED_CACHE=off` (the planning store's older switch) makes no folder `./off/`;
    `TESTBED_CAPACITY_DIR` moves the cache, and is an absolute path."""
    from testbed.emulator.runtime.coordinator import capacity

    work, kept = tmp_path / "work", tmp_path / "kept"
    work.mkdir()
    script = ("from testbed.run.dilation import WorkerCosts\n"
              "from testbed.emulator.runtime.coordinator import capacity\n"
              "capacity.measure_worker_costs = lambda: WorkerCosts(5e-05, 0.002)\n"
              "capacity.worker_costs()\n")
    subprocess.run([sys.executable, "-c", script], cwd=work, check=True, env={
        **os.environ, "TESTBED_CACHE": "off", "TESTBED_CAPACITY_DIR": str(kept)})
    assert list(work.iterdir()) == []
    assert json.loads((kept / "capacity.json").read_text())["span_cpu_s"] == 5e-05
    monkeypatch.setenv("TESTBED_CAPACITY_DIR", "off")
    with pytest.raises(InputError, match=r"^TESTBED_CAPACITY_DIR: 'off' is not an absolute"):
        capacity.cache_file()


@pytest.mark.parametrize("value", [1e-300, math.inf, math.nan, -1.0, 0, 1e300, True, "2e9",
                                   None])
def test_implausible_cached_capacity_figures_are_measured_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: object) -> None:
    """A figure read back outside its plausible range (1e-300 or Infinity would make the
    dilation 64 or 1) is not used: it is measured again, and the measurement kept."""
    from testbed.emulator.runtime.coordinator import capacity

    monkeypatch.setenv("TESTBED_CAPACITY_DIR", str(tmp_path))
    (tmp_path / "capacity.json").write_text(json.dumps({
        "machine": capacity._key(), "bps": value, "span_cpu_s": value,
        "idle_worker_cpu": value}))
    measured: list[str] = []
    costs = WorkerCosts(5e-05, 0.002)
    monkeypatch.setattr(capacity, "_probe", lambda: measured.append("bps") or 1.5e9)
    monkeypatch.setattr(capacity, "measure_worker_costs",
                        lambda: measured.append("costs") or costs)
    for _ in range(2):  # measured once, then read back
        assert capacity.machine_capacity_bps() == 1.5e9
        assert capacity.worker_costs() == costs
    assert measured == ["bps", "costs"]


@pytest.mark.parametrize("change", ["a link", "writable by all"])
def test_a_capacity_cache_others_could_write_is_measured_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str) -> None:
    """Figures read only from a file of testbed's own: a link (never followed) or a file
    anyone may write is treated as absent, said once; the new measurement replaces it."""
    from testbed.emulator.runtime.coordinator import capacity

    folder = tmp_path / "kept"
    folder.mkdir()
    monkeypatch.setenv("TESTBED_CAPACITY_DIR", str(folder))
    figures = json.dumps({"machine": capacity._key(), "span_cpu_s": 1e-4,
                          "idle_worker_cpu": 0.01})
    cached = folder / "capacity.json"
    if change == "a link":
        (tmp_path / "elsewhere.json").write_text(figures)
        cached.symlink_to(tmp_path / "elsewhere.json")
    else:
        cached.write_text(figures)
        cached.chmod(0o666)
    costs = WorkerCosts(5e-05, 0.002)
    monkeypatch.setattr(capacity, "measure_worker_costs", lambda: costs)
    with pytest.warns(UserWarning, match="not trusted") as caught:
        assert capacity.worker_costs() == costs
    assert len(caught) == 1
    assert not cached.is_symlink() and cached.stat().st_mode & 0o022 == 0
    assert capacity.worker_costs() == costs


def test_an_idle_worker_wakes_ten_times_a_second() -> None:
    """Its lag monitor is its upkeep, paid by every worker whatever the dilation: at 50
    looks a second 64 idle workers took a fifth of this 2-core machine."""
    from testbed.emulator.runtime.worker.process import lag_monitor, run_loop

    async def idle() -> int:
        samples: list[float] = []
        monitor = asyncio.create_task(lag_monitor(samples))
        await asyncio.sleep(1.0)
        monitor.cancel()
        return len(samples)

    assert run_loop(idle()) <= 10


def test_niced_work_is_told_apart(tmp_path: Path) -> None:
    """Work at a nice above 0 yields to the run's processes: what a run may plan on
    leaves it out."""
    from testbed.emulator.runtime.coordinator.health import read_cpu

    stat = tmp_path / "stat"
    stat.write_text("cpu  100 50 30 800 20 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    sample = read_cpu(stat)
    assert (sample.busy, sample.total, sample.niced) == (180, 1000, 50)


def test_mixed_congestion_controls_share_alike_when_dilated() -> None:
    """A CUBIC DC's flows against BBR's, of other round trips: their RTT-biased weights
    compare round trips with each other, not with a second, so a dilated network shares
    as the one it represents (hypothesis found this one)."""
    from testbed.topology.model import Datacenter, GpuType, TcpSettings, WanLink

    gpu = GpuType("a100", 312e12, 80 * 2**30, 0.5)
    bbr = TcpSettings("bbr", (4096, 131072, 1 << 20), (4096, 16384, 1 << 20), False, None)
    floor = MIN_RTT_S / 2
    topology = Topology("t", datacenters=(
        Datacenter("east", 1, gpu, 1e8, floor),
        Datacenter("west", 2, gpu, 1e8, floor),
        Datacenter("central", 1, gpu, 1e8, floor,
                   tcp=dataclasses.replace(bbr, congestion="cubic"))),
        links=(WanLink("east", "west", 0.005, 1e8), WanLink("east", "central", 0.0005, 1e8)),
        tcp=bbr)
    job = Job(ModelShape(layers=2, hidden=16, heads=1, seq_len=8, vocab=256),
              microbatch_size=1, microbatches=1, iterations=1)
    policy = training_policy("gpipe")
    plan = plan_with_simulator(policy, topology, job)
    plain = Simulator(topology, job, plan, policy).run()
    slow = Simulator(dilate_topology(topology, 2), job, plan, policy).run()
    ends = sorted(s["end"] for s in plain.spans)
    slow_ends = sorted(s["end"] for s in represented_spans(slow.spans, slow.start, 2))
    assert slow_ends == pytest.approx(ends, rel=1e-6, abs=1e-5)
