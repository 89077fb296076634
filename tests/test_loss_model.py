"""The loss model: monotone where its sources are, faithful to their published points,
exact methods on one curve, and honest where it extrapolates."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed import api
from testbed.loss.effects import (
    CompressedGradients,
    Exact,
    LocalSteps,
    LossEffect,
    diloco,
    streaming_diloco,
)
from testbed.loss.model import predict, tokens_to
from testbed.loss.published import (
    LARGEST_EFFECT,
    PENALTY_SPREAD,
    PublishedModel,
    sync_loss,
)
from testbed.loss.sources import (
    CHARLES_FITS,
    CHARLES_M,
    CHARLES_TABLE4,
    CHARLES_TABLE5,
    LAW,
    LAW_PARAMS,
)
from testbed.policy import training_policy

MODEL = PublishedModel()
payloads = st.sampled_from(["bf16", "fp32", "fp16", "int8", "int4", "top1%"])


@st.composite
def local_steps(draw: st.DrawFn, min_workers: int = 1) -> LocalSteps:
    fragments = draw(st.sampled_from([1, 1, 4, 13]))
    return LocalSteps(
        workers=draw(st.integers(min_workers, 16)), sync_every=draw(st.integers(1, 2000)),
        fragments=fragments, layers_per_fragment=None if fragments == 1 else 40 / fragments,
        overlap=draw(st.integers(0, 3)) if fragments > 1 else 0, payload=draw(payloads),
        mixing=0.5 if fragments > 1 else 0.0)


effects = st.one_of(st.just(Exact()), local_steps(),
                    payloads.map(CompressedGradients))
params = st.floats(1e7, 1e12)
tokens = st.floats(1e6, 1e14)


@given(effects, params, tokens, tokens)
def test_loss_falls_with_tokens(effect: LossEffect, n: float, d1: float, d2: float) -> None:
    low, high = sorted((d1, d2))
    if high > low * 1.0001:
        assert predict(MODEL, effect, n, high).loss < predict(MODEL, effect, n, low).loss


@given(effects, params, params, tokens)
def test_loss_falls_with_model_size(effect: LossEffect, n1: float, n2: float,
                                    d: float) -> None:
    small, large = sorted((n1, n2))
    if large > small * 1.0001:
        assert predict(MODEL, effect, large, d).loss < predict(MODEL, effect, small, d).loss


@given(local_steps(min_workers=2), st.floats(35e6, 1.3e9), tokens)
def test_the_diloco_family_never_beats_data_parallelism_where_its_sources_say_not(
        effect: LocalSteps, n: float, d: float) -> None:
    """Charles et al.'s Table 4: at M >= 2 DiLoCo's loss is above data parallelism's at
    every N up to 1.3B (H = 30); their Figure 9 and Douillard et al.'s Table 6: it rises
    with H from there."""
    effect = LocalSteps(effect.workers, max(30, effect.sync_every), effect.fragments,
                        effect.layers_per_fragment, effect.overlap, effect.payload)
    assert predict(MODEL, effect, n, d).loss > sync_loss(n, d)


@given(local_steps(), params, st.integers(1, 5000), st.integers(1, 5000))
def test_loss_rises_with_sync_period(effect: LocalSteps, n: float, h1: int,
                                     h2: int) -> None:
    short, long = sorted((h1, h2))
    if long > short:
        def at(h: int) -> float:
            return MODEL.penalty(LocalSteps(effect.workers, h, effect.fragments,
                                            effect.layers_per_fragment, effect.overlap,
                                            effect.payload), n).ratio
        assert at(long) > at(short)


def test_where_the_sources_say_diloco_wins_the_model_agrees() -> None:
    """One worker beats data parallelism at every size (Charles et al., Table 4); two do
    at 4B and 10B (Table 5)."""
    for n in CHARLES_TABLE4:
        assert MODEL.penalty(diloco(1, 30), n).ratio < 1
    for n in CHARLES_TABLE5:
        assert MODEL.penalty(diloco(2, 30), n).ratio < 1


def test_the_fits_are_within_one_percent_of_their_published_points() -> None:
    """Charles et al.'s Table 7 power laws at their Table 4 points, and the model's
    penalty (the ratio of two of them) within its stated band."""
    for n, row in CHARLES_TABLE4.items():
        for m, loss in zip(CHARLES_M, row, strict=True):
            a, alpha = CHARLES_FITS[m]
            assert abs(a * n ** alpha / loss - 1) < 0.01, (n, m)
            if m:
                ratio = MODEL.penalty(diloco(m, 30), n).ratio
                assert abs(ratio / (loss / row[0]) - 1) <= PENALTY_SPREAD + 1e-12


def test_exact_methods_share_one_curve_to_the_last_digit(tmp_path: Path) -> None:
    inputs = api.load(Path(__file__).parent.parent / "topologies" / "paper-3dc.yaml")
    curves = set()
    for policy in ("dp-across-dc", "gpipe", "1f1b", "interleaved-1f1b"):
        plan = api.plan(inputs, policy)
        effect = training_policy(policy).loss_effect(plan, inputs.topology)
        assert effect == Exact()
        curves.add(tuple(predict(MODEL, effect, 13e9, d).loss for d in (1e9, 1e11, 1e12)))
    assert len(curves) == 1
    assert curves.pop() == tuple(sync_loss(13e9, d) for d in (1e9, 1e11, 1e12))


def test_a_target_below_a_model_sizes_floor_is_never_reached() -> None:
    n = 13e9
    floor = MODEL.floor(n)
    reach = tokens_to(MODEL, Exact(), n, floor * 0.999)
    assert reach.tokens is None and "unlimited tokens" in (reach.reason or "")
    reach = tokens_to(MODEL, Exact(), n, sync_loss(n, 20 * n))
    assert reach.tokens is not None and math.isclose(reach.tokens, 20 * n, rel_tol=1e-9)


def test_outside_every_source_the_prediction_says_so_and_widens() -> None:
    inside = MODEL.penalty(diloco(2, 30), 1e9)
    assert not inside.extrapolated and not inside.reasons
    outside = MODEL.penalty(diloco(2, 30), 70e9)
    assert outside.extrapolated and "parameters" in outside.reasons[0]
    assert outside.high - outside.low > inside.high - inside.low
    assert math.isclose(outside.high / outside.ratio, 1 + PENALTY_SPREAD + LARGEST_EFFECT)
    huge = MODEL.synchronous(LAW_PARAMS[1] * 10, 1e12)
    assert huge.extrapolated and len(huge.reasons) == 2
    assert MODEL.penalty(CompressedGradients("int8"), 1e9).extrapolated
    assert MODEL.penalty(streaming_diloco(2, 100, 8, 3, payload="int4"), 1e9).extrapolated
    assert not MODEL.penalty(streaming_diloco(2, 100, 8, 3), 1e9).extrapolated


def test_the_synchronous_law_is_the_replications() -> None:
    n, d = 70e9, 1.4e12  # Chinchilla's size and tokens
    assert sync_loss(n, d) == pytest.approx(
        LAW["E"] + LAW["A"] / n ** LAW["alpha"] + LAW["B"] / d ** LAW["beta"])
    assert sync_loss(n, d) == pytest.approx(1.9739, abs=1e-4)  # 1.8172 + 0.0815 + 0.0752


def test_the_default_target_is_the_synchronous_loss_at_the_jobs_token_budget() -> None:
    from testbed.job.load import dump_job, parse_job
    from testbed.metrics.loss_prediction import default_target

    job = api.load(Path(__file__).parent.parent / "topologies" / "paper-3dc.yaml").job
    assert job.token_budget is None and job.tokens_budgeted == 20 * job.model.params
    assert default_target(MODEL, job) == sync_loss(job.model.params, 20 * job.model.params)
    budgeted = parse_job({**dump_job(job), "token_budget": 10**12}, "job.yaml", "")
    assert budgeted.tokens_budgeted == 10**12
    assert parse_job(dump_job(budgeted), "job.yaml", "") == budgeted  # written back
    assert default_target(MODEL, budgeted) == sync_loss(job.model.params, 1e12)


def test_atlas_and_the_torch_schedules_are_exact_and_the_diloco_family_is_not() -> None:
    inputs = api.load(Path(__file__).parent.parent / "topologies" / "two-dc.yaml")
    for policy in ("atlas", "zb-v", "dp-across-dc"):
        plan = api.plan(inputs, policy)
        assert training_policy(policy).loss_effect(plan, inputs.topology) == Exact(), policy
    plan = api.plan(inputs, "diloco", {"inner_steps": "8"})
    effect = training_policy("diloco", {"inner_steps": "8"}).loss_effect(plan, inputs.topology)
    assert isinstance(effect, LocalSteps)
    assert (effect.workers, effect.sync_every, effect.fragments) == (2, 8, 1)
    compressed = api.plan(inputs, "dp-compressed", {"payload": "int4"})
    assert training_policy("dp-compressed", {"payload": "int4"}).loss_effect(
        compressed, inputs.topology) == CompressedGradients("int4")
