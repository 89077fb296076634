"""Run-to-run noise for the simulator, seeded and recorded: without it every iteration of a
simulated plan repeats exactly, which no real run does. Each compute, each prefill and
each transfer's propagation takes its modeled time times a lognormal factor of mean 1 and
the given coefficient of variation (CV), drawn per operation, and each transfer's weight
where it shares a link is drawn the same way. Pure.

A run's setting (`--jitter`, testbed.run.spec) that the simulator applies: it lives in
plan/, beside the cost model whose times it scales, below both the run's settings and the
simulator, and imports nothing but units."""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass, replace
from typing import Literal

from testbed.common.units import parse_fraction

NoiseKind = Literal["compute", "prefill", "network", "share"]
KINDS: tuple[NoiseKind, ...] = ("compute", "prefill", "network", "share")


@dataclass(frozen=True)
class Jitter:
    compute: float = 0.0
    """CV of each forward and backward."""
    prefill: float = 0.0
    """CV of each prefill."""
    network: float = 0.0
    """CV of each transfer's one-way propagation delay."""
    share: float = 0.0
    """CV of each transfer's weight where it shares a link (max-min sharing): flows of a
    loss-based congestion control that meet at a bottleneck sit at different points of
    their window's sawtooth, so equal flows get unequal shares, message by message."""
    seed: int = 0

    def __bool__(self) -> bool:
        return any(getattr(self, kind) > 0 for kind in KINDS)

    def with_seed(self, seed: int) -> Jitter:
        return replace(self, seed=seed)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def parse_jitter(text: str) -> Jitter:
    """`0.1` (every kind) or `compute=10%,prefill=0.1,network=0.05,share=10%`; ValueError
    says why."""
    text = text.strip()
    if "=" not in text:
        cv = parse_fraction(text)
        return Jitter(cv, cv, cv, cv)
    values: dict[str, float] = {}
    for part in text.split(","):
        key, _, raw = part.partition("=")
        key = key.strip()
        if key not in KINDS:
            raise ValueError(f"unknown kind {key!r} (kinds: {', '.join(KINDS)})")
        if key in values:
            raise ValueError(f"{key} given twice")
        values[key] = parse_fraction(raw.strip())
    return Jitter(values.get("compute", 0.0), values.get("prefill", 0.0),
                  values.get("network", 0.0), values.get("share", 0.0))


class Noise:
    """The draws of one run: a stream per kind, so that adding network noise leaves the
    compute draws of the same seed as they were."""

    def __init__(self, jitter: Jitter) -> None:
        self.sigma = {kind: math.sqrt(math.log1p(getattr(jitter, kind) ** 2)) for kind in KINDS}
        self.streams = {kind: random.Random(f"{jitter.seed}:{kind}") for kind in KINDS}

    def factor(self, kind: NoiseKind) -> float:
        sigma = self.sigma[kind]
        if sigma == 0.0:
            return 1.0
        return self.streams[kind].lognormvariate(-sigma * sigma / 2, sigma)
