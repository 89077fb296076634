"""The simulator's seeded noise, and the paired slowdown interval `compare` reports."""

from __future__ import annotations

import functools
import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from testbed.experiments.comparison import comparison_runs
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.metrics.interval import mean_interval, t975
from testbed.plan.jitter import Jitter, Noise, parse_jitter
from testbed.policy import training_policy
from testbed.report.compare import RunEntry, slowdown_text, table_rows
from testbed.run.spec import RunSpec
from testbed.sim.simulator import Simulator

from .test_cli import call

pytestmark = pytest.mark.usefixtures("shared_planning")

ROOT = Path(__file__).resolve().parent.parent
PAPER = ROOT / "topologies" / "paper-3dc.yaml"


def test_jitter_is_parsed_per_kind_or_for_all() -> None:
    assert parse_jitter("10%") == Jitter(0.1, 0.1, 0.1, 0.1)
    assert parse_jitter("share=10%") == Jitter(share=0.1)
    assert parse_jitter("share=sawtooth") == Jitter(share=None)
    assert parse_jitter("compute=5%, share=sawtooth") == Jitter(compute=0.05, share=None)
    assert parse_jitter("share=0") == Jitter(share=0.0)
    assert Jitter(share=0.1) and not Jitter() and not Jitter(share=0.0)  # beyond the default
    assert parse_jitter("compute=0.1, network=5%") == Jitter(compute=0.1, network=0.05)
    for bad, why in (("speed=0.1", "unknown kind"), ("compute=2", "at most 100%"),
                     ("compute=0.1,compute=0.2", "twice"),
                     ("compute=sawtooth", "expected a fraction")):
        with pytest.raises(ValueError, match=why):
            parse_jitter(bad)


def test_noise_has_mean_one_and_the_asked_spread() -> None:
    noise = Noise(Jitter(compute=0.2, seed=7))
    draws = [noise.factor("compute") for _ in range(20_000)]
    assert statistics.fmean(draws) == pytest.approx(1.0, abs=0.01)
    assert statistics.stdev(draws) == pytest.approx(0.2, rel=0.05)
    assert min(draws) > 0
    assert {noise.factor("network") for _ in range(10)} == {1.0}  # zero CV: exact


def test_kinds_draw_from_their_own_streams() -> None:
    """Adding network noise leaves the compute draws of the same seed as they were."""
    alone = Noise(Jitter(compute=0.1, seed=3))
    mixed = Noise(Jitter(compute=0.1, network=0.3, seed=3))
    for _ in range(50):
        mixed.factor("network")
        assert alone.factor("compute") == mixed.factor("compute")


@functools.cache
def _planned() -> tuple[Any, Any, Any]:
    inputs = load_inputs(PAPER, sets=("iterations=3",))
    policy = training_policy("atlas")
    return inputs, policy, plan_with_simulator(policy, inputs.topology, inputs.job)


def _simulate(jitter: Jitter | None) -> list[float]:
    inputs, policy, plan = _planned()
    spans = Simulator(inputs.topology, inputs.job, plan, policy, jitter=jitter).run().spans
    return [s["end"] - s["start"] for s in spans if s["kind"] == "forward"]


def test_zero_jitter_changes_nothing_and_a_seed_repeats_exactly() -> None:
    plain = _simulate(None)
    assert _simulate(Jitter(seed=5)) == plain
    noisy = _simulate(Jitter(compute=0.1, network=0.05, seed=1))
    assert noisy == _simulate(Jitter(compute=0.1, network=0.05, seed=1))
    assert noisy != _simulate(Jitter(compute=0.1, network=0.05, seed=2))
    assert noisy != plain


def test_compute_jitter_spreads_each_forward_as_asked() -> None:
    plain = _simulate(None)
    noisy = _simulate(Jitter(compute=0.1, seed=1))
    ratios = [n / p for n, p in zip(noisy, plain, strict=True)]
    assert len(ratios) > 300
    assert statistics.fmean(ratios) == pytest.approx(1.0, abs=0.02)
    assert statistics.stdev(ratios) == pytest.approx(0.1, rel=0.2)


def test_share_noise_lets_equal_transfers_started_together_end_apart() -> None:
    """paper-3dc's 1F1B replicas send their first activations of an iteration together
    over one link: with equal shares (`share=0`) they end together; with shares drawn at
    CUBIC's sawtooth (the default, `share=sawtooth`) or at a CV given, apart."""
    inputs = load_inputs(PAPER, sets=("iterations=2",))
    policy = training_policy("1f1b")
    plan = plan_with_simulator(policy, inputs.topology, inputs.job)

    def first_ends(jitter: Jitter | None) -> list[float]:
        spans = Simulator(inputs.topology, inputs.job, plan, policy, jitter=jitter).run().spans
        return sorted(s["end"] for s in spans if s["kind"] == "transfer"
                      and s["iteration"] == 1 and s["microbatch"] == 0
                      and s["link"] == "east>central")

    equal = first_ends(Jitter(share=0.0))
    assert len(equal) == 4 and equal[0] == equal[-1]
    assert first_ends(Jitter(network=0.0, share=0.0, seed=3)) == equal
    assert first_ends(None) == first_ends(Jitter(share=None))
    assert len(set(first_ends(None))) == 4
    assert len(set(first_ends(Jitter(share=0.1, seed=3)))) == 4


def test_a_share_is_drawn_from_the_message_not_its_place_in_the_run() -> None:
    """The same message draws the same share in any run of the seed, whatever was drawn
    before it; the draws have mean 1 and the asked spread; with `share=sawtooth`, at the
    pair's congestion control's."""
    noise, other = Noise(Jitter(share=None, seed=4)), Noise(Jitter(share=None, seed=4))
    for k in range(20):
        other.share(0.2, f"warm-up:{k}")
        other.factor("share")
    assert noise.share(0.2, "a>b:SEND_F:7") == other.share(0.2, "a>b:SEND_F:7")
    assert noise.share(0.2, "a>b:SEND_F:7") \
        != Noise(Jitter(share=None, seed=5)).share(0.2, "a>b:SEND_F:7")
    draws = [noise.share(0.2, f"a>b:SEND_F:{k}") for k in range(20_000)]
    assert statistics.fmean(draws) == pytest.approx(1.0, abs=0.01)
    assert statistics.stdev(draws) == pytest.approx(0.2, rel=0.05)
    assert noise.share(0.0, "a>b:SEND_F:7") == 1.0
    assert Noise(Jitter(share=0.0, seed=4)).share(0.2, "a>b:SEND_F:7") == 1.0
    fixed = Noise(Jitter(share=0.05, seed=4))
    assert statistics.stdev(fixed.share(0.5, f"x:{k}") for k in range(20_000)) \
        == pytest.approx(0.05, rel=0.05)


def test_simulate_records_its_jitter_and_refuses_a_bad_one(tmp_path: Path) -> None:
    code, _, err = call(["simulate", str(PAPER), "-p", "gpipe", "--iterations", "2",
                         "--jitter", "compute=5%", "--out", str(tmp_path / "run")])
    assert code == 0, err
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["jitter"] == {"compute": 0.05, "prefill": 0.0, "network": 0.0,
                                 "share": None, "seed": 0}
    for given, share in ((["--jitter", "share=sawtooth"], None), ([], None),
                         (["--jitter", "share=0"], 0.0)):
        out = tmp_path / f"share-{len(given)}-{share}"
        code, _, err = call(["simulate", str(PAPER), "-p", "gpipe", "--iterations", "2",
                             *given, "--out", str(out)])
        assert code == 0, err
        results = json.loads((out / "results.json").read_text())
        assert results["jitter"] == {"compute": 0.0, "prefill": 0.0, "network": 0.0,
                                     "share": share, "seed": 0}
    code, _, err = call(["simulate", str(PAPER), "--jitter", "compute=lots",
                         "--out", str(tmp_path / "bad")])
    assert code == 2 and "--jitter" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


def test_t_quantiles_and_the_interval() -> None:
    assert t975(1) == 12.706 and t975(4) == 2.776 and t975(1000) == 1.96
    interval = mean_interval([1.0, 2.0, 3.0])
    assert interval.mean == 2.0
    assert interval.low == pytest.approx(2.0 - 4.303 / 3**0.5)
    assert interval.includes_zero
    assert not mean_interval([1.0, 1.1, 0.9]).includes_zero
    assert mean_interval([0.5]).low is None


def _entry(bubble: str, repeat: int, seconds: float) -> RunEntry:
    results: dict[str, Any] = {
        "iteration_time_s": {"median": seconds}, "tokens_per_s": 1000 / seconds,
        "gpu_utilization": {"training": 0.5, "total": 0.5}, "wan": {"utilization": 0.1},
        "inference": {"ttft_s": {"p50": None, "p99": None}}}
    return RunEntry("atlas", bubble, repeat, f"r{repeat}", "ok", None, results)


def test_compares_repeats_draw_shares_anew_in_the_simulator_only() -> None:
    """Without --jitter, repeat k of a simulated comparison draws its shares with the
    job's seed plus k (the default's noise is the shares'), where an emulated one has no
    noise of the simulator's to seed; a jitter given keeps its kinds."""
    inputs = load_inputs(PAPER, sets=("seed=7",))

    def jitters(backend: str, jitter: Jitter | None) -> list[Jitter | None]:
        base = RunSpec.build(backend, inputs.topology, inputs.job, policy="1f1b",
                             jitter=jitter)
        return [run.spec.simulate.jitter
                for run in comparison_runs(base, ["1f1b"], [], [], 3)]

    assert jitters("simulate", None) == [Jitter(seed=7 + k) for k in range(3)]
    assert jitters("simulate", Jitter(share=0.0)) == [Jitter(share=0.0, seed=7 + k)
                                                      for k in range(3)]
    assert jitters("emulate", None) == [None] * 3


def test_compare_pairs_the_slowdown_by_repeat() -> None:
    """Repeat k of both combinations met the same noise: their ratio is what counts."""
    entries = [_entry("none", k, s) for k, s in enumerate([10.0, 11.0, 12.0])]
    entries += [_entry("bubbletea", k, s) for k, s in enumerate([10.1, 11.11, 12.12])]
    row = table_rows(entries)[1]
    assert row.slowdown == pytest.approx(0.01)
    assert row.slowdown_interval is not None and not row.slowdown_interval.includes_zero
    assert slowdown_text(row).startswith("+1.00% [")
    noisy = [_entry("none", k, s) for k, s in enumerate([10.0, 10.0, 10.0])]
    noisy += [_entry("bubbletea", k, s) for k, s in enumerate([10.1, 9.9, 10.05])]
    assert slowdown_text(table_rows(noisy)[1]).endswith(", 0 inside]")


def _span(kind: str, start: float, end: float, **detail: Any) -> Any:
    return {"gpu": "g", "kind": kind, "start": start, "end": end, "iteration": 0, **detail}


def test_overruns_are_prefills_that_outlast_the_data_they_waited_for() -> None:
    from testbed.metrics.overruns import prefill_overruns

    spans = [
        _span("recv", 0.0, 1.0, waited=1.0), _span("prefill", 0.1, 0.5),  # fits
        _span("prefill", 0.5, 0.9),  # fits: a second one in the same bubble
        _span("recv", 2.0, 3.2, waited=1.0), _span("prefill", 2.1, 3.2),  # 0.2 s late
        _span("recv", 4.0, 4.0), _span("prefill", 5.0, 5.5),  # in no bubble
    ]
    got = prefill_overruns(spans)
    assert (got.prefills, got.overran) == (3, 1)
    assert got.mean_s == pytest.approx(0.2) and got.max_s == pytest.approx(0.2)
    assert got.as_dict()["fraction"] == pytest.approx(1 / 3)


def test_jitter_makes_prefills_overrun_and_results_count_them(tmp_path: Path) -> None:
    # Atlas: 1F1B's first stage cannot hold the 7B inference model beside training
    args = ["simulate", str(PAPER), "-p", "atlas", "-b", "bubbletea", "--iterations", "3",
            "--set", "inference.arrival_rate=200/s"]
    counted = []
    for extra in ([], ["--jitter", "compute=10%,prefill=10%"]):
        out = tmp_path / str(len(counted))
        code, _, err = call([*args, *extra, "--out", str(out)])
        assert code == 0, err
        counted.append(json.loads((out / "results.json").read_text())["inference"]["overruns"])
    quiet, noisy = counted
    assert quiet["prefills"] > 100 and noisy["prefills"] > 100
    assert noisy["overran"] > quiet["overran"]


def test_bubbletea_s_guard_widens_to_cover_recent_misses() -> None:
    from testbed.policy import bubble_policy
    from testbed.policy.base import Bubble, Request

    tea = bubble_policy("bubbletea", {"learn": "on"})
    assert tea.guard() == pytest.approx(0.1)  # type: ignore[attr-defined]
    for _ in range(50):
        tea.observe("bubble", 1.0, 0.7)  # bubbles came 30% shorter than predicted
        tea.observe("prefill", 0.1, 0.1)
    assert tea.guard() == pytest.approx(0.3)  # type: ignore[attr-defined]
    for _ in range(50):
        tea.observe("prefill", 0.1, 0.125)  # and prefills 25% longer
    assert tea.guard() == pytest.approx(1 - 0.7 / 1.25)  # type: ignore[attr-defined]
    request = Request(1, 0.0, 100)
    bubble = Bubble("g", 0.0, 1.0)
    assert tea.admit(bubble, [request], 0.0, lambda _n: 0.6) is None  # fits 0.1, not this
    fixed = bubble_policy("bubbletea", {})  # learning is asked for
    for _ in range(50):
        fixed.observe("bubble", 1.0, 0.5)
    assert fixed.guard() == pytest.approx(0.1)  # type: ignore[attr-defined]
    assert fixed.admit(bubble, [request], 0.0, lambda _n: 0.6) == request


def test_profile_measures_the_spread_a_jittered_run_had(tmp_path: Path) -> None:
    """`testbed profile` gives back, within sampling error, the noise a run was given."""
    code, _, err = call(["simulate", str(PAPER), "-p", "atlas", "-b", "bubbletea",
                         "--iterations", "3", "--set", "inference.arrival_rate=100",
                         "--set", "inference.prompt_length.min=256",
                         "--set", "inference.prompt_length.max=256",
                         "--jitter", "compute=10%,prefill=20%", "--out", str(tmp_path / "run")])
    assert code == 0, err
    code, out, err = call(["profile", str(tmp_path / "run")])
    assert code == 0, err
    spread = json.loads((tmp_path / "run" / "profile.json").read_text())["spread"]
    assert spread["compute"] == pytest.approx(0.10, abs=0.03)
    assert spread["prefill"] == pytest.approx(0.20, abs=0.06)
    assert "--jitter compute=" in out


def test_spread_is_pooled_over_groups_of_the_same_work() -> None:
    from testbed.report.profile import measured_spread

    def span(kind: str, length: float, **detail: Any) -> dict[str, Any]:
        return {"kind": kind, "start": 0.0, "end": length, "iteration": 1, "stage": 0,
                **detail}

    spans = [span("forward", 1.0), span("forward", 3.0), span("backward", 10.0),
             span("backward", 10.0), span("prefill", 5.0, tokens=8)]
    spread = measured_spread(spans)
    assert spread["compute"] == pytest.approx((0.5 * (2**0.5 / 2) ** 2) ** 0.5)
    assert spread["prefill"] is None  # one pass of that size: no spread to measure
