"""The built-in loss model, every coefficient from testbed.loss.sources:

- the synchronous curve: Besiroglu et al.'s refit of the Chinchilla law, L(N, D) =
  E + A/N^alpha + B/D^beta;
- DiLoCo's penalty at H = 30: Charles et al.'s power laws, L_M(N) / L_DP(N) =
  (A_M / A_DP) N^(alpha_M - alpha_DP) (Table 7), between fitted M interpolated in log M;
- how the penalty grows with H: Streaming DiLoCo's H = 30 against H = 100 (Douillard et
  al., Table 6), fitted here as (H / 30)^c_M, c_M the mean of log(L_100 / L_30) /
  log(100 / 30) over their model sizes;
- Streaming DiLoCo with its paper's fragments, overlap and mixing: DiLoCo's penalty (their
  Table 5 has the two equal within its rounding);
- outer gradients of 16 bits or more: lossless (OpenDiLoCo's FP16, Charles et al.'s bf16);
- everything else (other payloads, fragment sizes, overlaps, outer optimizers, compressed
  every-step gradients, N, M or H beyond the sources): the nearest sourced figure, marked
  extrapolated, its band widened by the largest effect a source measured.

The penalty is taken to hold at every token count, as measured at D = 20 N: Charles et
al.'s overtraining runs (Figure 11) keep their order up to 16 times that; Douillard et
al.'s Table 7 shows the M = 4 penalty shrinking with tokens (the benchmark shows it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from testbed.loss.effects import (
    DENSE,
    CompressedGradients,
    Exact,
    LocalSteps,
    LossEffect,
    Unmodelled,
)
from testbed.loss.model import EXACT, Estimate, Penalty
from testbed.loss.sources import (
    BESIROGLU,
    CHARLES,
    CHARLES_FIT_H,
    CHARLES_FITS,
    CHARLES_M,
    CHARLES_PARAMS,
    CHARLES_TABLE4,
    DOUILLARD,
    DOUILLARD_H,
    DOUILLARD_LAYERS_PER_FRAGMENT,
    DOUILLARD_M,
    DOUILLARD_MIXING,
    DOUILLARD_OVERLAP,
    DOUILLARD_TABLE5,
    DOUILLARD_TABLE6,
    JAGHOUAR,
    LAW,
    LAW_PARAMS,
    LAW_SPREAD,
    LAW_TOKENS,
    LAW_WORST,
    LIN,
)

NAME = "published"
FITTED_M = tuple(m for m in CHARLES_FITS if m)


def sync_loss(params: float, tokens: float) -> float:
    """Besiroglu et al.'s L(N, D)."""
    return float(LAW["E"] + LAW["A"] / params ** LAW["alpha"]
                 + LAW["B"] / tokens ** LAW["beta"])


def _in(value: float, bounds: tuple[float, float]) -> bool:
    return bounds[0] <= value <= bounds[1]


def _log_interp(points: Sequence[tuple[float, float]], x: float) -> float:
    """y at x, linear in log x between the points (sorted by x), the end segments
    extended beyond them."""
    xs = [p[0] for p in points]
    i = max(1, min(len(points) - 1, next((k for k, v in enumerate(xs) if v >= x),
                                         len(points) - 1)))
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    w = math.log(x / x0) / math.log(x1 / x0)
    return y0 + w * (y1 - y0)


def diloco_log_ratio(params: float, workers: int) -> float:
    """log(L_M / L_DP) at H = 30 from Charles et al.'s Table 7, interpolated in log M."""
    a0, e0 = CHARLES_FITS[0]

    def at(m: int) -> float:
        a, e = CHARLES_FITS[m]
        return math.log(a / a0) + (e - e0) * math.log(params)

    return _log_interp([(float(m), at(m)) for m in FITTED_M], float(workers))


def _h_exponents() -> dict[int, float]:
    """c_M of the H factor, from Douillard et al.'s Table 6."""
    low, high = DOUILLARD_H
    out = {}
    for m in DOUILLARD_M:
        logs = [math.log(row[(m, high)] / row[(m, low)]) for row in DOUILLARD_TABLE6.values()]
        out[m] = sum(logs) / len(logs) / math.log(high / low)
    return out


H_EXPONENTS = _h_exponents()


def h_log_factor(workers: int, sync_every: int) -> float:
    """log of the H factor (H / 30)^c_M, c_M interpolated (and beyond 2-4, extended) in
    log M."""
    c = _log_interp([(float(m), c) for m, c in H_EXPONENTS.items()], float(workers))
    return c * math.log(sync_every / CHARLES_FIT_H)


def _published_ratios() -> list[tuple[float, float, float]]:
    """(model ratio, published ratio) of every point the penalty stands on: Charles et
    al.'s Table 4 (M >= 1) and Douillard et al.'s Table 6 over Table 5's data parallelism;
    with the published ratio's distance from 1."""
    out = []
    for n, row in CHARLES_TABLE4.items():
        for m, loss in zip(CHARLES_M[1:], row[1:], strict=True):
            out.append((math.exp(diloco_log_ratio(n, m)), loss / row[0], abs(loss / row[0] - 1)))
    for n, by in DOUILLARD_TABLE6.items():
        dp = DOUILLARD_TABLE5[n][0]
        for (m, h), loss in by.items():
            model = math.exp(diloco_log_ratio(n, m) + h_log_factor(m, h))
            out.append((model, loss / dp, abs(loss / dp - 1)))
    return out


_POINTS = _published_ratios()
PENALTY_SPREAD = max(abs(model / published - 1) for model, published, _ in _POINTS)
"""The penalty's largest error at the published points it stands on: its band in range."""
LARGEST_EFFECT = max(effect for _, _, effect in _POINTS)
"""The largest loss change a source measured between a method and data parallelism: how
far an extrapolated penalty's band is widened."""


class PublishedModel:
    """The built-in model (see the module's docstring)."""

    name = NAME
    sources = tuple(s.cite for s in (BESIROGLU, CHARLES, DOUILLARD, JAGHOUAR, LIN))

    def synchronous(self, params: float, tokens: float) -> Estimate:
        loss = sync_loss(params, tokens)
        reasons = []
        if not _in(params, LAW_PARAMS):
            reasons.append(f"{params:.3g} parameters: the law was fitted on "
                           f"{LAW_PARAMS[0]:.3g}-{LAW_PARAMS[1]:.3g} (Besiroglu et al.)")
        if not _in(tokens, LAW_TOKENS):
            reasons.append(f"{tokens:.3g} tokens: the law was fitted on "
                           f"{LAW_TOKENS[0]:.3g}-{LAW_TOKENS[1]:.3g} (Besiroglu et al.)")
        width = LAW_WORST if reasons else LAW_SPREAD
        return Estimate(loss, loss * (1 - width), loss * (1 + width), bool(reasons),
                        tuple(reasons))

    def floor(self, params: float) -> float:
        return float(LAW["E"] + LAW["A"] / params ** LAW["alpha"])

    def irreducible(self) -> float:
        return LAW["E"]

    def penalty(self, effect: LossEffect, params: float) -> Penalty:
        if isinstance(effect, Exact):
            return EXACT
        if isinstance(effect, Unmodelled):
            raise ValueError(f"no loss model for this plan: {effect.reason}")
        if isinstance(effect, CompressedGradients):
            if effect.payload in DENSE:
                return EXACT
            return _widened(0.0, (
                f"{effect.payload} gradients with error feedback: no source measured the "
                "loss of every-step data parallelism so compressed at this scale (DGC, "
                "arXiv 1712.01887, reports no accuracy lost on smaller models)",), (LIN.key,))
        return local_steps_penalty(effect, params)


def local_steps_penalty(effect: LocalSteps, params: float) -> Penalty:
    """The DiLoCo family's penalty: Charles et al.'s M and N, Douillard et al.'s H."""
    m, h = effect.workers, effect.sync_every
    log_ratio = diloco_log_ratio(params, m) + h_log_factor(m, h)
    reasons = []
    used = [CHARLES.key]
    if not _in(params, CHARLES_PARAMS):
        reasons.append(f"{params:.3g} parameters: DiLoCo's fits are of "
                       f"{CHARLES_PARAMS[0]:.3g}-{CHARLES_PARAMS[1]:.3g} (Charles et al.; "
                       "their 4B and 10B runs check them, Table 5)")
    if m > max(FITTED_M):
        reasons.append(f"M={m}: DiLoCo was measured with up to {max(FITTED_M)} workers")
    if h != CHARLES_FIT_H:
        used.append(DOUILLARD.key)
        if not effect.streaming:
            reasons.append(f"H={h}: DiLoCo's fits are at H={CHARLES_FIT_H}; the H effect is "
                           "Streaming DiLoCo's (Douillard et al., Table 6), DiLoCo's own H "
                           "study is a figure (Charles et al., Figure 9)")
        elif not DOUILLARD_H[0] <= h <= DOUILLARD_H[1]:
            reasons.append(f"H={h}: Streaming DiLoCo was measured at H="
                           f"{DOUILLARD_H[0]} and {DOUILLARD_H[1]}")
        if not DOUILLARD_M[0] <= m <= DOUILLARD_M[-1]:
            reasons.append(f"M={m}: the H effect was measured at M="
                           f"{DOUILLARD_M[0]} and {DOUILLARD_M[-1]}")
    if effect.streaming:
        used.append(DOUILLARD.key)
        reasons += _streaming_reasons(effect)
    reasons += _payload_reasons(effect, used)
    if not (effect.nesterov and effect.outer_momentum == 0.9 and 0.2 <= effect.outer_lr <= 1.0):
        reasons.append(f"outer step lr {effect.outer_lr:g}, momentum "
                       f"{effect.outer_momentum:g}{' Nesterov' if effect.nesterov else ''}: "
                       "the sources used Nesterov momentum 0.9 at lr 0.2-1.0")
    ratio = math.exp(log_ratio)
    if reasons:
        return _widened(log_ratio, tuple(reasons), tuple(dict.fromkeys(used)))
    return Penalty(ratio, ratio * (1 - PENALTY_SPREAD), ratio * (1 + PENALTY_SPREAD), False,
                   (), tuple(dict.fromkeys(used)))


def _streaming_reasons(effect: LocalSteps) -> list[str]:
    out = []
    size = effect.layers_per_fragment
    if size is None or round(size) != DOUILLARD_LAYERS_PER_FRAGMENT:
        out.append(f"fragments of {size if size is not None else '?'} layers: Streaming "
                   f"DiLoCo's tables use {DOUILLARD_LAYERS_PER_FRAGMENT} (other sizes: its "
                   "Figure 6)")
    if effect.overlap != DOUILLARD_OVERLAP:
        out.append(f"overlap {effect.overlap}: Streaming DiLoCo's tables overlap "
                   f"{DOUILLARD_OVERLAP} inner step (others: its Figures 8 and 10)")
    if effect.overlap and effect.mixing != DOUILLARD_MIXING:
        out.append(f"mixing {effect.mixing:g}: Streaming DiLoCo mixes with "
                   f"alpha {DOUILLARD_MIXING:g}")
    return out


def _payload_reasons(effect: LocalSteps, used: list[str]) -> list[str]:
    if effect.payload in DENSE:
        if effect.payload in ("fp32", "fp16"):
            used.append(JAGHOUAR.key)
        return []
    return [f"{effect.payload} outer gradients: DiLoCo's were bf16 (Charles et al.), "
            "Streaming DiLoCo's 4-bit floats (E3M0), not blockwise integers or top-k"]


def _widened(log_ratio: float, reasons: tuple[str, ...], used: tuple[str, ...]) -> Penalty:
    """An extrapolated penalty: the nearest sourced figure, its band widened by the
    largest effect any source measured."""
    ratio = math.exp(log_ratio)
    width = PENALTY_SPREAD + LARGEST_EFFECT
    return Penalty(ratio, ratio * (1 - width), ratio * (1 + width), True, reasons, used)
