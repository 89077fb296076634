"""Loss against represented time and the time to a target loss, from a run's losses and
iteration ends: pure, no network (tests/test_training_root.py has it from real runs)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from testbed import api
from testbed.errors import InputError
from testbed.metrics.loss import (
    SIMULATED,
    LossPoint,
    loss_curve,
    time_to_loss,
    time_to_loss_text,
)
from testbed.metrics.summary import summarize
from testbed.report.results import RunRecord, strict_json
from testbed.report.table import run_summary
from testbed.run.dilation import represented_spans

from .conftest import TOPOLOGIES
from .test_metrics import uneven_spans


def _curve(losses: list[float]) -> list[LossPoint]:
    return loss_curve(dict(enumerate(losses)), [1.0 + i for i in range(len(losses))], 100)


def test_the_curve_has_every_completed_step_with_its_end_and_tokens() -> None:
    curve = loss_curve({0: 5.0, 1: 4.0, 2: 3.5, 3: 3.0}, [2.0, 2.5, 12.5], 1000)
    assert curve == [  # step 3 reported a loss but did not finish on every GPU
        {"iteration": 0, "time_s": 2.0, "tokens": 1000, "loss": 5.0},
        {"iteration": 1, "time_s": 2.5, "tokens": 2000, "loss": 4.0},
        {"iteration": 2, "time_s": 12.5, "tokens": 3000, "loss": 3.5}]


def test_time_to_loss_is_the_first_step_at_or_below_the_target() -> None:
    curve = _curve([5.0, math.nan, 4.0, 3.0, 2.9, 3.1])
    reached = time_to_loss(curve, 3.0)
    assert reached == {"target": 3.0, "reached": True, "iteration": 3, "time_s": 4.0,
                       "tokens": 400, "reason": None, "loss_of": "training",
                       "basis": "measured"}
    assert time_to_loss_text(reached) == "4.000 s, 400 tokens (iteration 4) to loss <= 3"
    missed = time_to_loss(curve, 2.5)
    assert missed["reached"] is False and missed["time_s"] is None
    assert missed["reason"] == "not reached in 6 iterations; lowest loss 2.9000"
    assert time_to_loss_text(missed) == ("loss <= 2.5 not reached in 6 iterations; lowest "
                                         "loss 2.9000")
    assert time_to_loss([], 2.5)["reason"] == "not reached in 0 iterations"
    assert time_to_loss(_curve([5.0]), 2.5)["reason"] == ("not reached in 1 iteration; "
                                                         "lowest loss 5.0000")
    unknown = time_to_loss([], 2.5, SIMULATED)
    assert unknown["reached"] is None and unknown["reason"] == SIMULATED
    assert time_to_loss_text(unknown) == f"n/a: {SIMULATED}"


def _record(compute: str, losses: dict[int, float] | None, spans: list[Any], start: float,
            target: float | None, synced: dict[int, float] | None = None) -> RunRecord:
    """A run of 1f1b, or with `synced` (the synchronized model's losses) of DiLoCo, H=2."""
    inputs = api.load(TOPOLOGIES / "two-dc.yaml")
    plan = api.plan(inputs, "1f1b") if synced is None else \
        api.plan(inputs, "diloco", {"inner_steps": "2"})
    summary = summarize(spans, ["a", "b"], start, 1000, 0.0)
    return RunRecord("emulate" if compute != "modeled" else "simulate", "1f1b", None,
                     inputs.topology, inputs.job, plan, None, compute, summary, spans,
                     start, losses=losses, target_loss=target, synced_losses=synced)


def test_a_diloco_run_ranks_its_synchronized_model_s_loss_not_its_replicas() -> None:
    """The replicas' local models reach 3.0 at step 2, mid-cycle; the synchronized model,
    kept at the start and after every cycle of two steps, only at step 4: that is the time
    ranked, and said to be."""
    record = _record("real", {0: 6.0, 1: 4.0, 2: 3.0, 3: 2.5, 4: 2.4, 5: 2.0},
                     uneven_spans([1.0] * 6), 0.0, 3.0, {0: 6.0, 2: 3.5, 4: 2.9, 6: 2.6})
    results = json.loads(strict_json(record.results()))
    assert [p["loss"] for p in results["loss_curve"]] == [6.0, 4.0, 3.0, 2.5, 2.4, 2.0]
    synced = results["synced_loss_curve"]
    assert [(p["iteration"], p["loss"]) for p in synced] == \
        [(0, 6.0), (2, 3.5), (4, 2.9), (6, 2.6)]
    # the model the run ends with, at its end
    assert synced[-1]["time_s"] == results["loss_curve"][-1]["time_s"]
    assert synced[-1]["tokens"] == results["loss_curve"][-1]["tokens"] == 6000
    ranked = results["time_to_loss"]
    assert (ranked["iteration"], ranked["loss_of"]) == (4, "synchronized")
    assert ranked["time_s"] == results["synced_loss_curve"][2]["time_s"]
    lines = run_summary(record.typed())
    assert any(line.endswith("to loss <= 3 (the synchronized model's)") for line in lines)
    assert ("  synced loss   6.0000 -> 2.6000 (the synchronized model, at the start and after "
            "each cycle)") in lines
    missed = _record("real", {0: 6.0, 1: 2.0}, uneven_spans([1.0] * 2), 0.0, 3.0, {0: 6.0})
    assert missed.results()["time_to_loss"]["reason"] == (
        "not reached by the synchronized model, evaluated 1 time; lowest loss 6.0000")
    simulated = _record("modeled", None, uneven_spans([1.0] * 2), 0.0, 3.0, {}).results()
    assert simulated["time_to_loss"]["loss_of"] == "synchronized"
    assert simulated["time_to_loss"]["reason"] == SIMULATED
    assert "synced_loss_curve" not in simulated


def test_a_dilated_run_reports_its_curve_in_represented_time() -> None:
    """Dilation K: wall offsets from the start divided by K (testbed.run.dilation), as the
    emulator's backend hands the spans over; the curve and the time to loss follow."""
    start, k = 100.0, 4
    wall = [{**s, "start": start + k * s["start"], "end": start + k * s["end"]}
            for s in uneven_spans([1.0, 0.5, 0.5, 3.0])]
    record = _record("real", {0: 6.0, 1: 5.0, 2: 4.0, 3: 3.0},
                     represented_spans(wall, start, k), start, 4.5)
    results = json.loads(strict_json(record.results()))
    assert [p["time_s"] for p in results["loss_curve"]] == pytest.approx([1.0, 1.5, 2.0, 5.0])
    assert [p["tokens"] for p in results["loss_curve"]] == [1000, 2000, 3000, 4000]
    assert results["time_to_loss"] == {"target": 4.5, "reached": True, "iteration": 2,
                                       "time_s": pytest.approx(2.0), "tokens": 3000,
                                       "reason": None, "loss_of": "training",
                                       "basis": "measured"}
    assert results["loss_note"] is None
    assert results["tokens"] == {"measured": 3000, "total": 4000,
                                 "measured_s": pytest.approx(4.0)}
    lines = run_summary(record.typed())
    assert "  time to loss  2.000 s, 3,000 tokens (iteration 3) to loss <= 4.5" in lines
    assert "  loss          6.0000 -> 3.0000 over 4 iterations" in lines
    assert any(line.startswith("  throughput    750 tokens/s (3,000 tokens in 4.000 s, "
                               "first iteration excluded)") for line in lines)


def test_a_diverged_step_is_null_in_the_curve_and_never_reaches_the_target() -> None:
    record = _record("real", {0: 6.0, 1: math.nan}, uneven_spans([1.0, 1.0]), 0.0, 1.0)
    results = json.loads(strict_json(record.results()))
    assert results["loss_curve"][1]["loss"] is None
    assert results["time_to_loss"]["reached"] is False
    assert "  loss          6.0000 -> nan over 2 iterations" in run_summary(record.typed())


@pytest.mark.parametrize(("compute", "label"), [("modeled", "the simulator trains no model"),
                                                ("emulated", "emulated compute trains no")])
def test_a_run_without_real_compute_says_it_has_no_loss(compute: str, label: str) -> None:
    """Without a loss model to predict it (a record made without one), no time at all."""
    record = _record(compute, None, uneven_spans([1.0, 1.0]), 0.0, 2.0)
    results = record.results()
    assert results["loss_curve"] is None and results["loss_note"].startswith(label)
    assert results["time_to_loss"]["reached"] is None
    assert results["time_to_loss"]["time_s"] is None
    assert results["time_to_loss"]["reason"] == results["loss_note"]
    [line] = [line for line in run_summary(record.typed()) if "time to loss" in line]
    assert line == f"  time to loss  n/a: {results['loss_note']}"
    no_target = _record(compute, None, uneven_spans([1.0, 1.0]), 0.0, None).results()
    assert no_target["time_to_loss"] is None


def test_the_api_reports_throughput_speedups_and_time_to_loss(tmp_path: Path) -> None:
    inputs = api.load(TOPOLOGIES / "two-dc.yaml", iterations=3)
    runs = api.compare(inputs, ["gpipe", "1f1b"], out=tmp_path, target_loss=3.0)
    gpipe, other = runs["gpipe"], runs["1f1b"]
    assert other.speedup(gpipe) == pytest.approx(other.tokens_per_s / gpipe.tokens_per_s)
    assert gpipe.tokens_per_s == gpipe.results["tokens_per_s"] > 0
    assert other.time_to_loss is not None and other.time_to_loss["basis"] == "predicted"
    assert other.time_to_loss["reached"] is False  # two-dc's tiny model: its floor is higher
    assert "approaches at" in (other.time_to_loss["reason"] or "")
    reaching = api.compare(inputs, ["gpipe"], out=tmp_path / "far", target_loss=9.0)["gpipe"]
    assert reaching.time_to_loss is not None and reaching.time_to_loss["reached"] is True
    assert reaching.time_to_loss["time_s"] == pytest.approx(
        (reaching.time_to_loss["tokens"] or 0) / reaching.tokens_per_s, rel=1e-6)


def test_the_api_refuses_a_target_no_loss_can_reach(tmp_path: Path) -> None:
    inputs = api.load(TOPOLOGIES / "two-dc.yaml", iterations=2)
    for bad in (math.nan, math.inf, 0.0, -1.0):
        with pytest.raises(InputError, match=r"^target_loss: must be a number above 0"):
            api.simulate(inputs, target_loss=bad, out=tmp_path / str(bad))
        assert not (tmp_path / str(bad)).exists()
