"""The measured loss-per-token penalty and the ordering check that
scripts/bench_loss_real.py reports beside the loss model's: pure arithmetic on curves."""

from __future__ import annotations

import math

import pytest

from testbed.metrics.loss import LossPoint, loss_curve, synced_loss_curve
from testbed.metrics.loss_penalty import (
    measured_penalty,
    ordering,
    penalty_steps,
    seed_mean,
    tune,
)

ENDS = [float(i + 1) for i in range(8)]


def _every_step(losses: list[float]) -> list[LossPoint]:
    return loss_curve(dict(enumerate(losses)), ENDS, 100)


def test_the_window_is_the_budgets_last_quarter() -> None:
    assert penalty_steps(128) == (96, 128)
    assert penalty_steps(8) == (6, 8)
    assert penalty_steps(2) == (1, 2)  # one step at least
    assert penalty_steps(10, share=1.0) == (0, 10)
    with pytest.raises(ValueError, match="at least one step"):
        penalty_steps(0)


def test_the_penalty_is_the_mean_loss_at_the_methods_points_over_the_baselines() -> None:
    baseline = _every_step([9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0])
    # a model kept every 2 steps: evaluated at steps 0, 2, 4, 6 and after the last (8)
    synced = synced_loss_curve({0: 9.0, 2: 7.5, 4: 6.0, 6: 4.5, 8: 3.0}, ENDS, 100)
    # steps 4-7: the method's points 4 and 6 against the baseline's 5.0 and 3.0 there
    assert measured_penalty(synced, baseline, (4, 8)) == pytest.approx((6.0 + 4.5) / 8.0)
    assert measured_penalty(baseline, baseline, penalty_steps(8)) == 1.0
    better = _every_step([x * 0.9 for x in (9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0)])
    assert measured_penalty(better, baseline, (0, 8)) == pytest.approx(0.9)


def test_a_diverged_loss_in_the_window_gives_no_penalty() -> None:
    baseline = _every_step([4.0] * 8)
    assert measured_penalty(_every_step([4.0] * 7 + [math.nan]), baseline, (4, 8)) is None
    shown = _every_step([4.0] * 8)  # as JSON reads a NaN back
    shown[5] = LossPoint(iteration=5, time_s=6.0, tokens=600, loss=None)
    assert measured_penalty(baseline, shown, (4, 8)) is None
    assert measured_penalty(_every_step([4.0] * 3 + [math.nan] + [4.0] * 4), baseline,
                            (4, 8)) == 1.0  # before the window


def test_points_the_baseline_lacks_or_other_tokens_are_refused() -> None:
    baseline = _every_step([4.0] * 8)
    with pytest.raises(ValueError, match="no evaluation point in steps 4-7"):
        measured_penalty(_every_step([4.0] * 3), baseline, (4, 8))
    with pytest.raises(ValueError, match=r"no loss at step\(s\) \[6, 7\]"):
        measured_penalty(baseline, _every_step([4.0] * 6), (4, 8))
    bigger = loss_curve(dict(enumerate([4.0] * 8)), ENDS, 200)
    with pytest.raises(ValueError, match="processed other tokens"):
        measured_penalty(bigger, baseline, (4, 8))


def test_the_ordering_holds_where_the_means_follow_the_model() -> None:
    predicted = {"dp": 1.0, "atlas": 1.0, "h4": 1.01, "h16": 1.02}
    measured = {"dp": [1.0, 1.0, 1.0], "atlas": [1.0, 1.0000001, 1.0],
                "h4": [1.05, 1.04, 1.06], "h16": [1.2, 1.03, 1.1]}
    check = ordering(predicted, measured)
    assert check["holds"] is True
    assert check["predicted"] == ["dp", "atlas", "h4", "h16"]
    assert check["measured"] == ["dp", "atlas", "h4", "h16"]
    assert len(check["pairs"]) == 5  # the exact pair is a tie, not ordered
    assert check["ties"] == [{"methods": ["dp", "atlas"],
                              "largest_gap": pytest.approx(1e-7)}]
    by_pair = {(p["lower"], p["higher"]): p for p in check["pairs"]}
    assert by_pair[("h4", "h16")] == {"lower": "h4", "higher": "h16", "holds": True,
                                      "every_seed": False}  # seed 1: 1.04 > 1.03
    assert by_pair[("dp", "h16")]["every_seed"] is True


def test_a_pair_in_the_other_order_breaks_it() -> None:
    predicted = {"dp": 1.0, "h16": 1.02, "h4": 1.01}
    check = ordering(predicted, {"dp": [1.0, 1.0], "h16": [1.03, 1.04], "h4": [1.05, 1.06]})
    assert check["holds"] is False
    assert check["measured"] == ["dp", "h16", "h4"]
    wrong = [p for p in check["pairs"] if not p["holds"]]
    assert wrong == [{"lower": "h4", "higher": "h16", "holds": False, "every_seed": True}]


def test_a_diverged_seed_leaves_the_method_unordered() -> None:
    assert seed_mean([1.0, None]) is None and seed_mean([]) is None
    assert seed_mean([1.0, 2.0]) == 1.5
    check = ordering({"dp": 1.0, "h4": 1.01}, {"dp": [1.0, 1.0], "h4": [1.1, None]})
    assert check["holds"] is False and check["measured"] == ["dp"]
    assert check["pairs"][0]["every_seed"] is False
    tied = ordering({"dp": 1.0, "atlas": 1.0}, {"dp": [1.0], "atlas": [None]})
    assert tied["holds"] is True and tied["ties"][0]["largest_gap"] is None


def test_tuning_chooses_the_value_with_the_lowest_mean_penalty() -> None:
    check = tune({0.7: [1.2, 1.25], 0.1: [1.04, 1.03], 0.2: [1.05, 1.01], 0.4: [1.1, 1.1]})
    assert check["chosen"] == 0.2  # mean 1.03 against 0.1's 1.035
    assert check["at_edge"] is False
    assert [p["value"] for p in check["grid"]] == [0.1, 0.2, 0.4, 0.7]
    assert check["grid"][0]["mean"] == pytest.approx(1.035)


def test_tuning_says_when_the_best_lies_at_the_grids_edge() -> None:
    assert tune({0.05: [1.01], 0.1: [1.02], 0.7: [1.2]}) == {
        "grid": [{"value": 0.05, "mean": 1.01}, {"value": 0.1, "mean": 1.02},
                 {"value": 0.7, "mean": 1.2}], "chosen": 0.05, "at_edge": True}
    assert tune({0.7: [1.1]})["at_edge"] is False  # one value: no grid to leave
    assert tune({0.1: [1.1, 1.1], 0.2: [1.1, 1.1]})["chosen"] == 0.1  # a tie: the lesser


def test_tuning_never_chooses_a_value_that_diverged() -> None:
    check = tune({0.1: [1.01, None], 0.7: [1.3, 1.2]})
    assert check["chosen"] == 0.7
    assert check["grid"][0]["mean"] is None
    with pytest.raises(ValueError, match="without diverging"):
        tune({0.1: [None], 0.7: [1.0, None]})
