"""scripts/bench_fidelity.py's verdict: each row judged where the machine did not set the
pace, one-GPU plans and machine-bound rows named, not judged."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from .scripts import script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return script("bench_fidelity")


def _block(median_s: float, dilation: int, bound: bool) -> dict[str, Any]:
    run = {"dilation": dilation, "emulation": {"cpu_bound": bound}}
    return {"median_s": median_s, "dilation": dilation, "runs": [run]}


def _row(policy: str, simulated: float, k1: dict[str, Any], auto: dict[str, Any] | None,
         plan: str = "dp 2 x pp 2") -> dict[str, Any]:
    return {"topology": "t", "policy": policy, "plan": plan, "simulated_s": simulated,
            "k1": k1, "auto": auto, "commit": "abc"}


def test_each_row_is_judged_at_the_least_dilation_the_machine_did_not_limit(
        bench: ModuleType) -> None:
    rows = [
        _row("free", 10.0, _block(10.3, 1, False), _block(9.0, 3, False)),  # K=1: +3%
        _row("bound", 10.0, _block(12.0, 1, True), _block(10.2, 3, False)),  # K=3: +2%
        _row("far", 10.0, _block(11.0, 1, False), None),  # +10%
        _row("busy", 10.0, _block(12.0, 1, True), _block(12.0, 3, True)),
        _row("alone", 1e-6, _block(1e-3, 1, False), None, plan="dp 1 x pp 1"),
        {"topology": "t", "policy": "long", "plan": "dp 3 x pp 4", "simulated_s": 300.0,
         "skipped": "predicted 1500 s"},
    ]
    said = bench.summary(rows)
    assert said.startswith("Each at the least dilation the machine did not limit, 2 of 3 ")
    assert "outside: t far (+10.0% at K=1)" in said
    assert "not judged: t busy" in said and "t alone" in said
    assert "t free" not in said and "t bound" not in said and "t long" not in said


def test_a_row_outside_across_mismatched_queues_says_so(bench: ModuleType) -> None:
    shallow = [{"link": "x>h", "pair": "x>y", "kind": "shallow", "queue_s": 0.01,
                "round_trip_s": 0.09}]
    rows = [{**_row("detour", 10.0, _block(12.5, 1, False), None), "queue_mismatches": shallow},
            {**_row("near", 10.0, _block(10.2, 1, False), None), "queue_mismatches": shallow},
            {**_row("far", 10.0, _block(11.0, 1, False), None), "queue_mismatches": []}]
    said = bench.summary(rows)
    assert ("outside: t detour (+25.0% at K=1, across queues too shallow for its round "
            "trips), t far (+10.0% at K=1)") in said
    assert "t near" not in said


def test_the_table_marks_machine_bound_runs(bench: ModuleType) -> None:
    table = bench.table([_row("bound", 10.0, _block(12.0, 1, True), _block(10.2, 3, False))])
    assert "12.000 s (machine-bound) | +20.0% | 3 | 10.200 s | +2.0% |" in table


def test_a_policy_that_cannot_plan_is_a_row_that_says_why(bench: ModuleType) -> None:
    row = {"topology": "t", "policy": "gpipe", "plan": "-", "simulated_s": None,
           "skipped": "no plan: stage 0 needs 99.1 GiB per GPU"}
    assert "| t | gpipe | - | - | not run (no plan: stage 0 needs 99.1 GiB per GPU)" \
        in bench.table([row])
    assert bench.summary([row]).startswith("Each at the least dilation the machine did not "
                                           "limit, 0 of 0 agree")


def test_a_cell_of_several_runs_says_how_many(bench: ModuleType) -> None:
    """A cell measured with --repeat is the median of its runs, and the verdict says so;
    a K auto that is K=1 is not counted twice."""
    three = _block(10.1, 1, False)
    three["runs"] = three["runs"] * 3
    said = bench.summary([_row("again", 10.0, three, three),
                          _row("once", 10.0, _block(10.2, 1, False), None)])
    assert "the median of several where said (t again at K=1: 3 runs)" in said
    assert "t once" not in said
    assert "several" not in bench.summary([_row("once", 10.0, _block(10.2, 1, False), None)])


def test_a_dilated_run_is_judged_against_the_network_it_emulates(bench: ModuleType) -> None:
    """Dilated, a 3 Gbit/s link runs at 0.75 and its windows keep less of their buffers in
    flight: the run is judged against the simulator of that network, and dilation's own
    effect on the figure is named where it passes the target."""
    auto = _block(11.5, 4, False)
    auto["simulated_dilated_s"] = 11.3
    row = _row("slowed", 10.0, _block(12.0, 1, True), auto)
    said = bench.summary([row])
    assert said.startswith("Each at the least dilation the machine did not limit, 1 of 1 ")
    assert "dilation itself changed what was measured" in said
    assert "t slowed (+13.0% at K=4)" in said
    assert "| 4 | 11.500 s | +15.0% (+1.8% against the dilated network) |" in bench.table([row])
    far = _block(12.0, 4, False)
    far["simulated_dilated_s"] = 10.2
    assert "outside: t far (+17.6% at K=4)" in bench.summary(
        [_row("far", 10.0, _block(12.0, 1, True), far)])
    near = _block(10.1, 4, False)
    near["simulated_dilated_s"] = 10.2
    assert "dilation itself" not in bench.summary([_row("near", 10.0, _block(9.0, 1, True),
                                                        near)])


def test_share_noise_reruns_exactly_the_judged_rows_and_counts_both_ways(
        bench: ModuleType) -> None:
    rows = [
        _row("free", 10.0, _block(10.3, 1, False), _block(9.0, 3, False)),
        _row("bound", 10.0, _block(12.0, 1, True), _block(10.2, 3, False)),
        _row("busy", 10.0, _block(12.0, 1, True), _block(12.0, 3, True)),
        _row("alone", 1e-6, _block(1e-3, 1, False), None, plan="dp 1 x pp 1"),
    ]
    judged = [bench._judged(row) for row in rows]
    assert judged == [rows[0]["k1"], rows[1]["auto"], None, None]
    result = {"seeds": 3, "rows": [
        {"topology": "t", "policy": "lockstep", "plan": "dp 4 x pp 3", "congestion": "cubic",
         "share_cv": 0.092, "dilation": 1, "emulated_s": 8.2, "emulated_runs": 3,
         "equal_s": 10.0, "in_step": {"contended": 12, "in_step": 12}, "sawtooth_s": 8.3,
         "noisy_s": [8.0, 8.4, 9.0],
         "noisy_median_s": 8.4},
        {"topology": "t", "policy": "bbr", "plan": "dp 2 x pp 2", "congestion": "bbr",
         "share_cv": 0.0, "dilation": 1, "emulated_s": 10.1, "emulated_runs": 1,
         "equal_s": 10.0, "sawtooth_s": 10.0, "noisy_s": [10.0, 10.0, 10.0],
         "noisy_median_s": 10.0}]}
    summary = bench.share_noise_summary(result)
    assert summary.startswith("Within 5% of the emulator: 1 of 2 with equal shares, 2 with "
                              "drawn shares (the default) at the job's seed, 2 at the median "
                              "of 3 seeds")
    assert "Rows the share noise moved by more than 1%: t lockstep (-18.0% -> -1.2%)." \
        in summary
    assert "; 1 row held some in step, and the share noise moved 1 of them" in summary
    table = bench.share_noise_table(result)
    assert "| cubic (9.2%) | 1 | 8.200 s, 3 runs | 10.000 s | -18.0% | 12 of 12 | 8.300 s | " \
        "-1.2% | 8.400 s (8.000-9.000) | -2.4% |" in table
    # a row from before the count was kept
    assert "| bbr (0.0%) | 1 | 10.100 s | 10.000 s | +1.0% | - | 10.000 s | +1.0% |" in table


def test_a_machine_bound_run_is_followed_once_at_the_dilation_it_suggests(
        bench: ModuleType) -> None:
    """As a user told `try --dilation 4` goes on: auto picked 1, whose run was bound and
    suggested 4; the run at 4 is the row's K auto, marked, and not followed again."""
    def bound(k: int, suggested: int) -> dict[str, Any]:
        run = {"dilation": k, "emulation": {"cpu_bound": True,
                                            "suggested_dilation": suggested}}
        return {"median_s": 1.0, "dilation": k, "runs": [run]}

    asked: list[int] = []

    def emulated(dilation: int) -> dict[str, Any]:
        asked.append(dilation)
        return bound(dilation, dilation * 2)

    k1 = bound(1, 4)
    auto = bench.emulate_auto(k1, 1, 1.0, 100.0, emulated, lambda k: 0.5)
    assert asked == [4] and auto["followed"] and auto["simulated_dilated_s"] == 0.5
    assert bench.table([_row("p", 1.0, k1, auto)]).count("| 4 (suggested) |") == 1
    assert "what that run suggested (marked so)" in bench.summary([_row("p", 1.0, k1, auto)])
    asked.clear()  # auto picked 2, its run was free: nothing more
    free = _block(1.0, 2, False)
    assert bench.emulate_auto(k1, 2, 1.0, 100.0, lambda dilation: free, lambda k: 1.0) \
        is free
    # too long at the suggestion: K=1's own runs stand
    assert bench.emulate_auto(k1, 1, 50.0, 100.0, emulated, lambda k: 0.5) is k1
    assert asked == []
