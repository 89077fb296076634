"""Atlas: placement properties, arbitration never overlaps, never slower than baselines."""

from __future__ import annotations

import functools
import itertools
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from testbed_plugins.atlas.estimate import connections_to_fill
from testbed_plugins.atlas.placement import capacity, fill, largest_first, place

from testbed.errors import InputError
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.metrics.summary import summarize
from testbed.plan import validate_plan
from testbed.plan.describe import wan_crossings
from testbed.plan.model import Sharing
from testbed.plan.tcp_model import HostLimits, window_efficiency
from testbed.policy import training_policy
from testbed.sim.simulate import simulate_plan
from testbed.sim.simulator import Simulator
from testbed.topology import parse_topology

from .strategies import job_fitting, topologies

ROOT = Path(__file__).resolve().parent.parent
CACHE: dict[Any, Any] = {}
"""Shared by every plan here, as one command's plans share it: Atlas's ablations reuse
its simulations."""


@functools.cache
def _serial_search(name: str) -> tuple[Any, dict[Any, Any], tuple[tuple[Any, float | None], ...]]:
    """Atlas's search on a shipped topology as one process makes it, with a cache of its
    own: its choice, what it measured (by key), and each simulation it ran (the plan, notes
    left out, and the stop). The reference of the tests of stopping early, of measuring
    in parallel and of never simulating twice (made once: a search takes seconds)."""
    from dataclasses import replace

    from testbed.experiments.planning import planning_context

    inputs = load_inputs(ROOT / "topologies" / f"{name}.yaml")
    policy = training_policy("atlas")
    context = planning_context(inputs.topology, inputs.job, policy, {})
    runs: list[tuple[Any, float | None]] = []
    simulate = context._simulator
    assert simulate is not None

    def counted(plan: Any, job: Any, stop_above: float | None) -> float | None:
        runs.append((replace(plan, notes={}), stop_above))
        return simulate(plan, job, stop_above)

    context._simulator = counted
    context.processes = 1  # the runs counted here, not in forked workers
    chosen, ranked, _ = policy.choose(inputs.topology, inputs.job, context)  # type: ignore[attr-defined]
    return chosen, {c.key: c for c in ranked}, tuple(runs)


@given(topologies(), st.integers(1, 4), st.integers(1, 12), st.sampled_from([1, 2]))
def test_fill_is_feasible_exactly_when_the_stages_fit(topology: Any, dp: int, pp: int,
                                                      tp: int) -> None:
    order = largest_first(topology)
    room = capacity(topology, order, dp, tp)
    if pp > room:
        with pytest.raises(InputError, match=r"stages \(\d+ GPUs\) are missing"):
            fill(topology, order, pp, dp, tp)
        return
    chain = fill(topology, order, pp, dp, tp)
    assert sum(chain.stages) == pp
    sizes = [topology.dc(n).gpus for n in chain.dcs]
    assert sizes == sorted(sizes, reverse=True)  # largest first
    placement = place(topology, chain, dp, tp)
    used = [g for gpus in placement.values() for g in gpus]
    assert len(used) == len(set(used)) == dp * pp * tp
    for stage in range(pp):  # every replica (and TP group) of a stage in one DC
        dcs = {topology.dc_of(g) for r in range(dp) for g in placement[(r, stage)]}
        assert len(dcs) == 1


@settings(max_examples=20)
@given(data=st.data())
def test_atlas_plans_keep_dp_inside_dcs_and_cross_the_wan_once_per_dc(
        data: st.DataObject) -> None:
    topology = data.draw(topologies(min_dcs=1, max_dcs=3, max_gpus=4))
    job = data.draw(job_fitting(topology))
    selection = data.draw(st.sampled_from(["on", "off"]))
    policy = training_policy("atlas", {"selection": selection})
    try:
        plan = plan_with_simulator(policy, topology, job, CACHE)
    except InputError:
        assume(False)
    validate_plan(plan, topology)
    for stage in range(plan.pp):
        assert len({topology.dc_of(plan.lead_gpu(r, stage)) for r in range(plan.dp)}) == 1
    used = {topology.dc_of(g) for g in plan.used_gpus()}
    assert wan_crossings(plan, topology) == len(used) - 1
    for (a, b), n in plan.connections.items():
        if topology.dc_of(a) != topology.dc_of(b):
            assert n >= 1
    assert plan.notes["dc_selection"]["chosen"]["dp"] == plan.dp


def test_connections_cover_the_bandwidth_delay_product() -> None:
    inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml")
    topology = inputs.topology
    # 1 Gbit/s x 90 ms RTT = 11 MB; a 4 MiB buffer keeps about 3.6 MB in flight
    assert connections_to_fill(topology, "east", "west") >= 3
    assert connections_to_fill(topology, "east", "east") == 1
    assert connections_to_fill(topology, "east", "west", limit=2) == 2


def _arbitrated_sends_never_overlap(spans: list[dict[str, Any]], plan: Any) -> int:
    arbitrated = {f"{a}>{b}" for (a, b), s in plan.sharing.items() if s is Sharing.ARBITRATED}
    by_lane: dict[str, list[tuple[float, float]]] = {}
    for span in spans:
        if span["kind"] == "send" and span.get("link") in arbitrated \
                and span.get("microbatch") is not None:
            by_lane.setdefault(span["link"], []).append((span["start"], span["end"]))
    checked = 0
    for intervals in by_lane.values():
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert start >= end - 1e-9
            checked += 1
    return checked


def test_arbiter_never_overlaps_transfers_in_the_simulator() -> None:
    inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml", sets=("dp=4", "pp=3",
                                                                       "iterations=2"))
    policy = training_policy("atlas")
    plan = plan_with_simulator(policy, inputs.topology, inputs.job, CACHE)
    assert any(s is Sharing.ARBITRATED for s in plan.sharing.values())
    _, spans = simulate_plan(inputs.topology, inputs.job, plan, policy)
    assert _arbitrated_sends_never_overlap(spans, plan) > 20


@pytest.mark.parametrize("name", ["two-dc", "paper-3dc"])
def test_atlas_never_slower_than_gpipe_and_no_ablation_beats_it(name: str) -> None:
    inputs = load_inputs(ROOT / "topologies" / f"{name}.yaml")
    times = {}
    for policy_name in ("gpipe", "atlas", "atlas-no-multiconn", "atlas-no-temporal",
                        "atlas-no-selection"):
        policy = training_policy(policy_name)
        plan = plan_with_simulator(policy, inputs.topology, inputs.job, CACHE)
        summary, _ = simulate_plan(inputs.topology, inputs.job, plan, policy)
        times[policy_name] = summary.median_s
    assert times["atlas"] <= times["gpipe"] * (1 + 1e-9), times
    for ablation in ("atlas-no-multiconn", "atlas-no-temporal", "atlas-no-selection"):
        assert times[ablation] >= times["atlas"] * (1 - 1e-9), times


def test_infeasible_jobs_say_what_is_missing() -> None:
    inputs = load_inputs(ROOT / "topologies" / "two-dc.yaml", sets=("dp=3", "pp=2"))
    with pytest.raises(InputError, match="no placement fits"):
        plan_with_simulator(training_policy("atlas"), inputs.topology, inputs.job, CACHE)


def test_selection_leaves_out_a_far_dc_that_would_slow_the_job() -> None:
    from testbed.topology import dump_topology, load_topology, parse_topology

    data = dump_topology(load_topology(ROOT / "topologies" / "paper-3dc.yaml"))
    data["datacenters"].append({"name": "far", "gpus": 4, "gpu": "a100",
                                "bandwidth": "100Gbit", "latency": "50us"})
    data["wan"].append({"between": ["west", "far"], "latency": "150ms",
                        "bandwidth": "100Mbit"})
    topology = parse_topology(data, "far.yaml")
    job = load_inputs(ROOT / "topologies" / "paper-3dc.yaml").job
    plan = plan_with_simulator(training_policy("atlas"), topology, job, CACHE)
    used = {topology.dc_of(g) for g in plan.used_gpus()}
    assert "far" not in used and len(used) >= 2
    chosen = plan.notes["dc_selection"]["chosen"]
    assert "far" not in chosen["dcs"]


def test_ablations_reuse_atlas_simulations_from_a_shared_cache(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import testbed.experiments.planning as planning

    inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml")
    with planning.shared_cache() as cache:
        full = plan_with_simulator(training_policy("atlas"), inputs.topology, inputs.job)
        assert cache, "atlas keeps its simulations in the command's cache"

        def no_simulation(*_args: Any, **_kwargs: Any) -> Any:
            raise AssertionError("simulated again")

        monkeypatch.setattr(planning, "simulated_iteration_s", no_simulation)
        ablation = plan_with_simulator(training_policy("atlas-no-temporal"), inputs.topology,
                                       inputs.job)
    assert ablation.placement == full.placement
    assert planning.planning_context(inputs.topology, inputs.job,
                                     training_policy("atlas")).cache == {}


class _DelayedCompute(Simulator):
    """Every forward and backward held longer by a random fraction up to `scale`."""

    def __init__(self, *args: Any, seed: int, scale: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.rng, self.scale = random.Random(seed), scale

    def compute_s(self, compute: Any) -> float:
        return super().compute_s(compute) * (1 + self.scale * self.rng.random())


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**16), st.sampled_from([0.01, 0.05, 0.2, 0.5]))
def test_random_compute_delays_never_speed_atlas_up(seed: int, scale: float) -> None:
    """Atlas's transfer order leaves nothing that delaying some compute would win back."""
    inputs, plan, steady = _atlas_on_paper_3dc()
    delayed = _iteration_s(_DelayedCompute(inputs.topology, inputs.job, plan,
                                           training_policy("atlas"), seed=seed, scale=scale),
                           plan)
    assert delayed >= steady * 0.99, (steady, delayed)


@functools.cache
def _atlas_on_paper_3dc() -> tuple[Any, Any, float]:
    """paper-3dc over three iterations, Atlas's plan for it and its iteration time."""
    inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml", sets=("iterations=3",))
    policy = training_policy("atlas")
    plan = plan_with_simulator(policy, inputs.topology, inputs.job, CACHE)
    return inputs, plan, _iteration_s(Simulator(inputs.topology, inputs.job, plan, policy), plan)


def _iteration_s(simulator: Simulator, plan: Any) -> float:
    seconds = summarize(simulator.run().spans, plan.used_gpus(), 0.0, 1, 1.0).median_s
    assert seconds is not None
    return seconds


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4), st.integers(1, 10), st.data())  # two-dc's model: 4 layers
def test_per_stage_warmups_that_never_grow_down_the_pipeline_never_deadlock(
        stages: int, microbatches: int, data: st.DataObject) -> None:
    from testbed.plan.build import Schedule, build_plan
    from testbed.topology import parse_topology

    extras = sorted(data.draw(st.lists(st.integers(0, 6), min_size=stages, max_size=stages)),
                    reverse=True)
    topology = parse_topology({"datacenters": [{"name": "a", "gpus": 2 * stages}]}, "t.yaml")
    job = load_inputs(ROOT / "topologies" / "two-dc.yaml",
                      sets=(f"microbatches={microbatches}", "dp=2")).job
    placement = {(r, s): (f"a-{r * stages + s}",) for r in range(2) for s in range(stages)}
    plan = build_plan("t", topology, job, placement, Schedule.ONE_F_ONE_B,
                      extra_warmup=extras)
    validate_plan(plan, topology)  # a dry run: every receive meets its send, no deadlock


def test_per_stage_warmups_that_grow_are_refused() -> None:
    from testbed.plan.build import Schedule
    from testbed.plan.schedules import parse_schedule

    assert parse_schedule("1f1b+4/2/2/0") == ("1f1b", (4, 2, 2, 0))
    assert Schedule.ONE_F_ONE_B.label((3, 3)) == "1f1b+3"
    with pytest.raises(ValueError, match="must not grow"):
        Schedule.ONE_F_ONE_B.label((0, 2))
    with pytest.raises(ValueError, match="unknown schedule"):
        parse_schedule("gpipe+1/0")


def _constructed(dcs: list[tuple[str, int, str]], links: list[tuple[str, str, str, str]]
                 ) -> Any:
    from testbed.topology import parse_topology

    return parse_topology({
        "tcp": {"congestion": "cubic", "rmem": ["4KiB", "128KiB", "6MiB"],
                "wmem": ["4KiB", "16KiB", "4MiB"]},
        "datacenters": [{"name": n, "gpus": g, "gpu": t} for n, g, t in dcs],
        "wan": [{"between": [a, b], "latency": lat, "bandwidth": bw}
                for a, b, lat, bw in links]}, "constructed.yaml")


SMALL_CASES = {
    "mixed, uneven": ([("a", 2, "a100"), ("b", 2, "h100"), ("c", 3, "a100")],
                      [("a", "b", "20ms", "1Gbit"), ("b", "c", "30ms", "1Gbit"),
                       ("a", "c", "45ms", "500Mbit")]),
    "a far thin DC": ([("a", 2, "a100"), ("b", 2, "a100"), ("far", 2, "a100")],
                      [("a", "b", "10ms", "1Gbit"), ("b", "far", "150ms", "100Mbit")]),
}


@pytest.mark.parametrize("case", SMALL_CASES)
def test_the_staged_search_is_within_3_percent_of_simulating_everything(case: str) -> None:
    from testbed.experiments.planning import shared_cache
    from testbed.job.load import parse_job

    topology = _constructed(*SMALL_CASES[case])
    job = parse_job({"model": {"layers": 40, "hidden": 5120, "heads": 40, "seq_len": 2048,
                               "vocab": 50257}, "microbatch_size": 1, "global_batch": 8,
                     "iterations": 3}, "constructed.yaml")
    seconds = {}
    for search in ("staged", "exhaustive"):
        policy = training_policy("atlas", {"search": search})
        with shared_cache():
            plan = plan_with_simulator(policy, topology, job)
        summary, _ = simulate_plan(topology, job, plan, policy)
        assert summary.median_s is not None
        seconds[search] = summary.median_s
        # the recorded lower bound holds (it is rounded to four digits)
        assert summary.median_s >= plan.notes["lower_bound_s"] * (1 - 1e-3), search
    assert seconds["staged"] <= seconds["exhaustive"] * 1.03, seconds


def test_the_lower_bound_holds_for_a_plan_with_two_stages_per_gpu() -> None:
    """paper-3dc with H100, A100 and V100 DCs: Atlas picks zb-v (two stages per GPU, split
    backwards), whose GPUs start on a part of the work upstream of them."""
    import yaml

    from testbed.experiments.planning import shared_cache
    from testbed.job.load import parse_job

    data = yaml.safe_load((ROOT / "topologies" / "paper-3dc.yaml").read_text())
    for dc, gpu in zip(data["datacenters"], ("h100", "a100", "v100"), strict=True):
        dc["gpu"] = gpu
    job = data.pop("job")
    topology = parse_topology(data, "mixed.yaml")
    policy = training_policy("atlas", {})
    with shared_cache():
        plan = plan_with_simulator(policy, topology, parse_job(job, "mixed.yaml"))
    assert plan.stages_per_gpu > 1, plan.notes.get("dc_selection")
    summary, _ = simulate_plan(topology, parse_job(job, "mixed.yaml"), plan, policy)
    assert summary.median_s is not None
    assert summary.median_s >= plan.notes["lower_bound_s"] * (1 - 1e-3)


def test_the_plan_says_why_temporal_sharing_is_on_or_off() -> None:
    inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml", sets=("dp=4", "pp=3"))
    plan = plan_with_simulator(training_policy("atlas"), inputs.topology, inputs.job, CACHE)
    why = plan.notes["dc_selection"]["why"]
    verdict = "on" if plan.dp_cells else "off"
    assert f"temporal sharing {verdict}:" in why, why
    assert plan.notes["planning_s"] >= 0


def test_the_connection_cap_comes_from_the_path_and_the_hosts() -> None:
    """10 Gbit/s x 100 ms RTT is 125 MB in flight, 35 windows of 4 MiB: no constant caps
    that, only what a host allows a worker (two neighbours, one file and one full send
    buffer per connection)."""
    topology = parse_topology({
        "datacenters": [{"name": "east", "gpus": 1}, {"name": "west", "gpus": 1}],
        "wan": [{"between": ["east", "west"], "latency": "50ms", "bandwidth": "10Gbit"}],
    }, "far.yaml")
    need = connections_to_fill(topology, "east", "west")
    window = window_efficiency(10e9) * 4 * 2**20  # what one keeps in flight at 10 Gbit/s
    assert need == math.ceil(1.5 * 10e9 * 0.1 / 8 / window)
    assert need > 16
    assert connections_to_fill(topology, "east", "west", HostLimits(open_files=64 + 2 * 10)) == 10
    buffers = HostLimits(tcp_memory_bytes=2 * 7 * 4 * 2**20)
    assert connections_to_fill(topology, "east", "west", buffers) == 7
    assert connections_to_fill(topology, "east", "west", limit=5) == 5


@pytest.mark.parametrize("name", ["paper-3dc",
                                  pytest.param("wan-3dc", marks=pytest.mark.benchmark)])
def test_stopping_slower_candidates_early_changes_no_choice(
        name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A candidate's simulation stops once it is sure to be slower than what it is compared
    with; its time is then a lower bound ("at least") on the full simulation's, and the
    search measures and chooses exactly what it would without stopping."""
    from testbed_plugins.atlas import search as search_module

    from testbed.experiments.planning import planning_context

    inputs = load_inputs(ROOT / "topologies" / f"{name}.yaml")
    policy = training_policy("atlas")

    def choose() -> tuple[Any, dict[Any, Any]]:
        chosen, ranked, _ = policy.choose(  # type: ignore[attr-defined]
            inputs.topology, inputs.job, planning_context(inputs.topology, inputs.job, policy, {}))
        return chosen, {c.key: c for c in ranked}

    bounded_choice, bounded, _ = _serial_search(name)
    real_run = search_module.Search.run

    def unbounded_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.bounded = False
        return real_run(self, *args, **kwargs)

    monkeypatch.setattr(search_module.Search, "run", unbounded_run)
    full_choice, full = choose()
    assert bounded_choice == full_choice
    assert set(bounded) == set(full)
    stopped = [k for k, c in bounded.items() if c.at_least]
    assert stopped, "some candidate is slower than the leaders"
    for key, candidate in bounded.items():
        exact = full[key].simulated_s
        if candidate.at_least:
            assert candidate.simulated_s <= exact
            assert candidate.tokens_per_s > full[key].tokens_per_s * (1 - 1e-12)
        else:
            assert candidate.simulated_s == exact


SMALL_FAST = {
    "datacenters": [{"name": "east", "gpus": 2}, {"name": "west", "gpus": 2}],
    "wan": [{"between": ["east", "west"], "latency": "1ms", "bandwidth": "100Gbit"}],
    "job": {"model": {"layers": 16, "hidden": 2048, "heads": 16, "seq_len": 2048,
                      "vocab": 32000}, "microbatch_size": 1, "global_batch": 8,
            "iterations": 3},
}


def test_atlas_takes_a_zero_bubble_order_where_compute_bounds_the_pipeline() -> None:
    """Two DCs a millisecond apart: the pipeline's bubbles are compute's, and ZB-V's order
    over two stages per GPU fills them."""
    from testbed.job.load import parse_job

    topology = parse_topology(SMALL_FAST, "small.yaml")
    job = parse_job(SMALL_FAST["job"])
    times = {}
    for setting in ("on", "off"):
        policy = training_policy("atlas", {"two_per_gpu": setting})
        plan = plan_with_simulator(policy, topology, job, {})
        chosen = plan.notes["dc_selection"]["chosen"]
        times[setting] = chosen["simulated_s"]
        if setting == "on":
            assert chosen["schedule"] in ("zb-v", "interleaved-zb x2", "interleaved-1f1b x2")
            assert plan.stages_per_gpu == 2 and plan.pp == 2 * chosen["pp"]
        else:
            assert plan.stages_per_gpu == 1
    assert times["on"] < times["off"] * 0.9


def test_a_cache_shared_by_plans_for_other_hosts_answers_each_with_its_own_times() -> None:
    """The hosts' open-file limit sets Atlas's connections per DC pair, so a simulated time
    depends on it: a cache shared with a plan for hosts that allow more connections must
    not answer a plan for hosts that allow fewer (the key left the limits out)."""
    from testbed.experiments.planning import planning_context
    from testbed.job.load import parse_job
    from testbed.policy.registry import make_plan

    data = {**SMALL_FAST, "wan": [{"between": ["east", "west"], "latency": "50ms",
                                   "bandwidth": "10Gbit"}]}
    data["job"] = {**SMALL_FAST["job"], "model": {"layers": 8, "hidden": 4096, "heads": 32,
                                                  "seq_len": 2048, "vocab": 32000}}
    topology = parse_topology(data, "far.yaml")
    job = parse_job(data["job"])

    def chosen_s(open_files: int, cache: dict[Any, Any]) -> float:
        policy = training_policy("atlas")
        context = planning_context(topology, job, policy, cache)
        context.host_limits = HostLimits(open_files=open_files)
        chosen = make_plan(policy, topology, job, context).notes["dc_selection"]["chosen"]
        return float(chosen["simulated_s"])

    shared: dict[Any, Any] = {}
    many = chosen_s(4096, shared)
    few = chosen_s(100, {})  # 18 connections a pair, where 4,096 files allow 50
    assert few > many * 1.01
    assert chosen_s(100, shared) == few


def test_atlas_tries_two_stages_per_gpu_only_where_they_fit() -> None:
    from testbed_plugins.atlas.placement import Chain
    from testbed_plugins.atlas.schedules import placed
    from testbed_plugins.atlas.search import Candidate

    from testbed.plan.build import Schedule, fits_memory

    dcs = ("east", "central", "west")
    base = Candidate(dcs, 4, 3, Chain(dcs, (1, 1, 1)), 1.0, 1)
    for size, expected in ((1, ["interleaved-1f1b x2", "interleaved-zb x2", "zb-v"]),
                           (10, ["interleaved-zb x2", "zb-v"]), (14, [])):
        inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml",
                             sets=(f"microbatch_size={size}", f"global_batch={48 * size}"))
        policy = training_policy("atlas")
        tried = policy._two_per_gpu(inputs.topology, inputs.job, base)  # type: ignore[attr-defined]
        assert [c.schedule for c in tried] == expected, size
        assert all(c.virtual == 2 and c.pp == 3 for c in tried)
        for kind in (Schedule.INTERLEAVED_1F1B, Schedule.INTERLEAVED_ZB, Schedule.ZB_V):
            placement = placed(inputs.topology, inputs.job, base.chain, 4, kind, 2)
            assert fits_memory(inputs.topology, inputs.job, placement, kind) == any(
                c.schedule_kind is kind for c in tried)
    off = training_policy("atlas", {"two_per_gpu": "off"})
    inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml")
    assert off._two_per_gpu(inputs.topology, inputs.job, base) == []  # type: ignore[attr-defined]
    many = Candidate(dcs, 1, 24, Chain(dcs, (8, 8, 8)), 1.0, 1)  # 48 stages, 40 layers
    assert training_policy("atlas")._two_per_gpu(  # type: ignore[attr-defined]
        inputs.topology, inputs.job, many) == []


@pytest.mark.parametrize("sequences", [48, 480])
def test_candidates_are_those_whose_own_order_fits(sequences: int,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Atlas checks GPipe's order on a placement and, where it fits, no other order of
    one stage per GPU: the same candidates as checking each schedule's own order (on
    both batches GPipe fits on some placements and not on others)."""
    from testbed_plugins.atlas import policy as atlas

    from testbed.plan.build import Schedule, fits_memory

    inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml",
                         sets=(f"global_batch={sequences}",))
    policy = training_policy("atlas")
    shortcut = policy._candidates(inputs.topology, inputs.job)  # type: ignore[attr-defined]

    def each_on_its_own(*args: Any) -> bool:
        """GPipe's check for the whole placement (no warm-up argument) says no: every
        schedule's own order is checked."""
        return len(args) == 5 and fits_memory(*args)

    monkeypatch.setattr(atlas, "fits_memory", each_on_its_own)
    expected = policy._candidates(inputs.topology, inputs.job)  # type: ignore[attr-defined]
    assert shortcut == expected and shortcut
    placements = {(c.chain, c.dp) for c in shortcut}
    gpipe = {(c.chain, c.dp) for c in shortcut if c.schedule_kind is Schedule.GPIPE}
    assert gpipe and gpipe < placements


def test_a_planning_pool_runs_its_calls_in_other_processes() -> None:
    import os

    from testbed.policy.context import PlanningContext

    with PlanningContext(processes=2).pool(lambda x: (x, os.getpid())) as pool:
        waiting = [pool.submit(i) for i in range(6)]
        results = [wait() for wait in waiting]
    assert pool.size == 2
    assert [x for x, _ in results] == list(range(6))
    assert os.getpid() not in {pid for _, pid in results}
    with PlanningContext().pool(lambda x: (x, os.getpid())) as serial:
        assert serial.size == 1 and serial.submit(7)() == (7, os.getpid())


_PRELOADED: list[str] = []


def test_a_planning_pool_preloads_while_its_workers_start_then_forks_them_again() -> None:
    """The preload runs here while the first calls run in the workers; once it is done
    and no call is under way, the calls run in workers forked afterwards, which inherit
    what it loaded. No thread is left behind, and a preload that fails is left to the
    calls (they run as they would have)."""
    import os
    import threading

    from testbed.policy.context import PlanningContext

    _PRELOADED.clear()
    threads = threading.active_count()
    first_done, loaded = threading.Event(), threading.Event()

    def preload() -> None:
        assert first_done.wait(10)  # a slow import
        _PRELOADED.append("torch, say")
        loaded.set()

    with PlanningContext(processes=2).pool(lambda x: (x, tuple(_PRELOADED), os.getpid()),
                                           preload) as pool:
        first = pool.submit(0)()
        first_done.set()
        assert loaded.wait(10)
        later = [pool.submit(i) for i in (1, 2)]
        results = [wait() for wait in later]
    assert first[:2] == (0, ()) and first[2] != os.getpid()  # a worker forked before it
    assert [x for x, _, _ in results] == [1, 2]
    assert all(inherited == ("torch, say",) for _, inherited, _ in results)
    assert threading.active_count() == threads

    def fails() -> None:
        raise ImportError("no such module")

    with PlanningContext(processes=2).pool(lambda x: x * 2, fails) as pool:
        assert [pool.submit(i)() for i in range(4)] == [0, 2, 4, 6]
    assert threading.active_count() == threads
    with PlanningContext().pool(lambda x: x, lambda: _PRELOADED.append("no")) as serial:
        assert serial.submit(3)() == 3
    assert _PRELOADED == ["torch, say"]  # where calls run here, nothing to preload for


@pytest.mark.parametrize("processes", [1, 2])
def test_a_long_search_says_how_it_goes(processes: int, monkeypatch: pytest.MonkeyPatch
                                        ) -> None:
    """Planning with somewhere to say it: a line per candidate simulated where one is due
    at once (every 0 s), each counted once in the planning process, whether it ran there
    or in a pool's worker."""
    import testbed.experiments.planning as planning
    import testbed.policy.context as context_module

    monkeypatch.setattr(context_module, "PROGRESS_EVERY_S", 0.0)
    monkeypatch.setattr(planning, "planning_processes", lambda: processes)
    inputs = load_inputs(ROOT / "topologies" / "two-dc.yaml")
    lines: list[str] = []
    planning.plan_with_simulator(training_policy("atlas"), inputs.topology, inputs.job, {},
                                 say=lines.append)
    assert len(lines) >= 5
    assert all(line.startswith("planning with atlas: ") and line.endswith(" s so far")
               for line in lines)
    counts = [int(line.split(": ")[1].split()[0]) for line in lines]
    assert counts == list(range(1, len(lines) + 1))


def test_answers_another_measurement_gives_do_not_hold_back_the_processes() -> None:
    """A candidate whose answer is known (`Known`) takes no process: two measurements stay
    under way beside any number of them, and the results are those measured."""
    from dataclasses import replace

    from testbed_plugins.atlas.placement import Chain
    from testbed_plugins.atlas.search import Candidate, Known, Search

    dcs = ("east",)
    candidates = [Candidate(dcs, dp, 1, Chain(dcs, (1,)), 1.0, 100) for dp in range(9)]
    under_way: set[int] = set()
    most = 0

    def measure(candidate: Any, _floor: float | None) -> Any:
        nonlocal most
        answer = replace(candidate, simulated_s=float(candidate.dp + 1))
        if candidate.dp % 3:
            return Known(lambda: answer)
        under_way.add(candidate.dp)
        most = max(most, len(under_way))

        def wait() -> Any:
            under_way.discard(candidate.dp)
            return answer
        return wait

    out = Search(measure, ahead=2).run(candidates)
    assert [c.simulated_s for c in out] == [float(dp + 1) for dp in range(9)]
    assert most == 3  # all three measured ones at once (two, and one started early)


@pytest.mark.parametrize(("name", "processes"), [
    ("paper-3dc", 2),
    # three at a time: the same check at another setting (the search's own test above
    # has three measured at once)
    pytest.param("paper-3dc", 3, marks=pytest.mark.benchmark),
    pytest.param("wan-3dc", 2, marks=pytest.mark.benchmark),
    pytest.param("wan-3dc", 3, marks=pytest.mark.benchmark)])
def test_candidates_measured_in_parallel_make_the_same_choice(name: str, processes: int
                                                              ) -> None:
    """Atlas's candidates simulated `processes` at a time: the same plan as one after
    another, the same candidates, each exact time the same, and still some stopped early
    (a candidate started before the one ahead of it is in may be measured further)."""
    from testbed.experiments.planning import planning_context

    inputs = load_inputs(ROOT / "topologies" / f"{name}.yaml")
    policy = training_policy("atlas")

    def choose(processes: int) -> tuple[Any, dict[Any, Any]]:
        context = planning_context(inputs.topology, inputs.job, policy, {})
        context.processes = processes
        chosen, ranked, _ = policy.choose(inputs.topology, inputs.job, context)  # type: ignore[attr-defined]
        return chosen, {c.key: c for c in ranked}

    serial_choice, serial, _ = _serial_search(name)
    choice, parallel = choose(processes)
    assert choice == serial_choice
    assert set(parallel) == set(serial)
    assert any(c.at_least for c in parallel.values())
    for key, candidate in parallel.items():
        if not candidate.at_least and not serial[key].at_least:
            assert candidate.simulated_s == serial[key].simulated_s
        elif serial[key].at_least:
            assert candidate.simulated_s >= serial[key].simulated_s


def _ctrl_c_live() -> None:
    """As at a terminal: SIGINT neither ignored nor blocked, whatever this test process
    inherited or holds (a command started with SIGINT ignored, as `cmd &` in a script
    is, keeps it ignored, as it should)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


@pytest.mark.parametrize("group", [True, False])
def test_a_stop_while_atlas_plans_on_several_cores_leaves_no_worker_and_no_traceback(
        group: bool, tmp_path: Path) -> None:
    """Ctrl-C reaches the terminal's whole process group, the planning process's workers
    among them: they leave it to that process, which ends in one line. SIGTERM reaches
    that process alone: it stops its workers and ends in one line too (its workers not
    each with a broken pipe's traceback, seconds later). Either way the results directory
    it had made, still empty, is gone."""
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "testbed"), "simulate",
         str(ROOT / "topologies" / "paper-3dc.yaml"), "-p", "atlas", "--iterations", "50"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        preexec_fn=_ctrl_c_live, cwd=tmp_path)  # its results directory: not the checkout's
    deadline = time.monotonic() + 120
    workers: list[int] = []
    while len(workers) < 2:  # the pool is open: planning is under way
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
        workers = [int(c) for c in Path(f"/proc/{process.pid}/task/{process.pid}/children")
                   .read_text().split()]
    time.sleep(0.5)
    if group:
        os.killpg(process.pid, signal.SIGINT)
    else:
        process.terminate()
    _, err = process.communicate(timeout=60)
    assert (process.returncode, err.lstrip("\n")) == (  # click moves past the ^C first
        (130, "testbed: interrupted\n") if group else (143, "testbed: terminated\n"))
    assert not list((tmp_path / "runs").iterdir())
    time.sleep(0.5)
    assert not [w for w in workers if Path(f"/proc/{w}").exists()
                and Path(f"/proc/{w}/stat").read_text().split()[2] != "Z"]


PRELOADED = """
import sys
from testbed.experiments.inputs import load_inputs
from testbed.policy import training_policy
from testbed.policy.context import PlanningContext

class Watched(PlanningContext):
    def pool(self, work, preload=None):
        print("torch" in sys.modules, getattr(preload, "__name__", None), flush=True)
        return super().pool(work, preload)

inputs = load_inputs(sys.argv[1])
policy = training_policy("atlas", {"two_per_gpu": sys.argv[2]})
policy.plan(inputs.topology, inputs.job, Watched(inputs.job))
print("torch" in sys.modules)
"""


@pytest.mark.parametrize("two_per_gpu", ["on", "off"])
def test_atlas_plans_without_importing_torch(two_per_gpu: str) -> None:
    """torch's orders over two stages per GPU are computed without torch (seconds of a
    first run): planning neither preloads nor imports it, with two stages per GPU tried
    or not (a fresh process: nothing else has loaded torch)."""
    done = subprocess.run([sys.executable, "-c", PRELOADED,
                           str(ROOT / "topologies" / "paper-3dc.yaml"), two_per_gpu],
                          capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "None", "False"]


def test_ranking_transfers_as_they_arrive_chooses_as_ranking_the_queue_anew() -> None:
    """Atlas keeps each queue's transfers in a heap as they arrive: across grants,
    arrivals, transfers that leave without a grant (a run stopped early) and runs of the
    same plan again, each choice is the one a policy with no memory makes of the same
    queue."""
    from testbed.plan.model import Op
    from testbed.policy.base import Transfer

    inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml")
    policy = training_policy("atlas")
    plan = plan_with_simulator(policy, inputs.topology, inputs.job, CACHE)
    sends = [(replica, stage, op) for replica in range(plan.dp) for stage in range(plan.pp)
             for op in (Op.SEND_F, Op.SEND_B)
             if 0 <= stage + (1 if op is Op.SEND_F else -1) < plan.pp]
    rng = random.Random(7)
    ids = itertools.count()
    link = ("east", "central")
    for _run in range(3):  # the same plan again: the heaps still hold the last run's
        waiting: list[Transfer] = []
        for _ in range(300):
            for _ in range(rng.randint(0, 3)):
                replica, stage, op = rng.choice(sends)
                waiting.append(Transfer(next(ids), "a", "b", *link, op, replica, stage,
                                        rng.randrange(plan.microbatches), 1, 0.0,
                                        rng.randrange(2)))
            if waiting and rng.random() < 0.1:
                waiting.pop(rng.randrange(len(waiting)))  # left without a grant
            if waiting:
                chosen = policy.next_transfer(plan, link, tuple(waiting))
                assert chosen is training_policy("atlas").next_transfer(
                    plan, link, tuple(waiting))
                waiting.remove(chosen)


PINNED = {
    "paper-3dc": {"dcs": ["east", "central"], "stages": [4, 4], "dp": 1, "pp": 8,
                  "schedule": "1f1b+2/2/2/2/0/0/0/0", "temporal": False, "dp_cell": None,
                  "multi_connection": True, "predicted_s": 9.6336, "simulated_s": 9.749,
                  "at_least": False, "tokens_per_s": 10083.5},
    "wan-3dc": {"dcs": ["east", "central", "west"], "stages": [2, 2, 2], "dp": 2, "pp": 6,
                "schedule": "zb-v", "temporal": True, "dp_cell": 2, "multi_connection": True,
                "predicted_s": 5.8959, "simulated_s": 5.5274, "at_least": False,
                "tokens_per_s": 17785.0},
}
"""Atlas's choice on shipped topologies, as its search made it before planning was made
faster: making it faster must change no choice and no simulated time."""


@pytest.mark.parametrize("name", sorted(PINNED))
def test_atlas_chooses_as_it_always_has(name: str) -> None:
    inputs = load_inputs(ROOT / "topologies" / f"{name}.yaml")
    plan = plan_with_simulator(training_policy("atlas"), inputs.topology, inputs.job, CACHE)
    assert plan.notes["dc_selection"]["chosen"] == PINNED[name]


def test_candidates_atlas_takes_for_twins_make_the_same_plan() -> None:
    """Schedules that give every GPU the same actions (1F1B with all microbatches in
    warm-up and GPipe; more warm-up than there are microbatches) make one plan, whatever
    their names: what lets Atlas simulate it once."""
    from dataclasses import replace

    from testbed_plugins.atlas.twins import twin

    inputs = load_inputs(ROOT / "topologies" / "paper-3dc.yaml")
    policy = training_policy("atlas")
    groups: dict[Any, list[Any]] = {}
    for candidate in policy._candidates(inputs.topology, inputs.job):  # type: ignore[attr-defined]
        groups.setdefault(twin(inputs.job, candidate), []).append(candidate)
    twins = [group for group in groups.values() if len(group) > 1]
    assert len(twins) > 10 and len({c.schedule for g in twins for c in g}) > 2
    for group in twins:
        plans = [replace(policy._assemble(inputs.topology, inputs.job, c), notes={})  # type: ignore[attr-defined]
                 for c in group]
        assert all(plan == plans[0] for plan in plans[1:]), [c.schedule for c in group]


def test_atlas_never_simulates_the_same_plan_to_the_same_stop_twice() -> None:
    """A candidate whose plan was simulated already (a twin under another schedule's
    name) takes that answer where the same run would give it."""
    chosen, _, runs = _serial_search("paper-3dc")
    assert chosen.describe() == PINNED["paper-3dc"]
    assert len(runs) > 20
    for i, (plan, stop) in enumerate(runs):
        assert not any(plan == other and stop == other_stop for other, other_stop in runs[:i])


def test_candidates_start_a_step_early_once_on_the_floor_known_then() -> None:
    """With two measuring at once, candidate i starts before i - 2 is in (a process that is
    done need not wait), on the floor known then (the best of those before i - 2), and is
    measured once: that floor is never above the one it is due (the best of those before
    i - 1), so its run goes at least as far as a run on the due floor would."""
    from dataclasses import replace

    from testbed_plugins.atlas.placement import Chain
    from testbed_plugins.atlas.search import Candidate, Search

    seconds = [5.0, 4.0, 6.0, 3.0, 7.0, 7.5, 2.0, 8.0]
    dcs = ("east",)
    candidates = [Candidate(dcs, dp, 1, Chain(dcs, (1,)), 1.0, 100) for dp in range(8)]
    started: list[tuple[int, float | None]] = []
    under_way: set[int] = set()
    most = 0

    def measure(candidate: Any, floor: float | None) -> Any:
        nonlocal most
        started.append((candidate.dp, floor))
        under_way.add(candidate.dp)
        most = max(most, len(under_way))

        def wait() -> Any:
            under_way.discard(candidate.dp)
            return replace(candidate, simulated_s=seconds[candidate.dp])
        return wait

    state = Search(measure, bounded=True, ahead=2)

    def best() -> float | None:
        done = state.best(lambda _c: True)
        return None if done is None else done.tokens_per_s

    state.run(candidates, best)
    assert most == 3

    def best_of(first: int) -> float | None:
        return 100 / min(seconds[:first]) if first > 0 else None

    due = [best_of(i - 1) for i in range(8)]
    known = [best_of(i - 2) if i >= 2 else None for i in range(8)]  # when started early
    assert started == list(enumerate(known))  # each once, on the floor known then
    assert all(k is None or (d is not None and k <= d) for k, d in zip(known, due, strict=True))
    assert known != due  # some were due a higher floor
