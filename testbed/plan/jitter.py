"""Run-to-run noise for the simulator, seeded and recorded: without it every iteration of a
simulated plan repeats exactly, which no real run does. Each compute, each prefill and
each transfer's propagation takes its modeled time times a lognormal factor of mean 1 and
the given coefficient of variation (CV), drawn per operation, and each transfer's weight
where it shares a link is drawn the same way, at a CV given or, by default, at each
pair's congestion control's own spread (`share=sawtooth`): real TCP never gives equal
flows equal shares,
and a model that does keeps replicas that start together in a lockstep no real run keeps
(docs/simulator.md, "Share noise"). Pure.

A run's setting (`--jitter`, testbed.run.spec) that the simulator applies: it lives in
plan/, beside the cost model whose times it scales, below both the run's settings and the
simulator, and imports nothing but units."""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import asdict, dataclass, replace
from statistics import NormalDist
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
    share: float | None = None
    """CV of each transfer's weight where it shares a link (max-min sharing): flows of a
    loss-based congestion control that meet at a bottleneck sit at different points of
    their window's sawtooth, so equal flows get unequal shares, message by message.
    None (`share=sawtooth`, the default): each pair's congestion control's own spread
    (testbed.plan.tcp_model.sawtooth_cv: CUBIC 9.2%, Reno 19.2%, BBR 0); 0: equal
    shares."""
    seed: int = 0

    def __bool__(self) -> bool:
        """Whether any noise was asked for beyond the shares' default."""
        return any((getattr(self, kind) or 0.0) > 0 for kind in KINDS)

    def with_seed(self, seed: int) -> Jitter:
        return replace(self, seed=seed)

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)


SAWTOOTH = "sawtooth"
"""`share=sawtooth`: each pair's congestion control's own spread."""


def parse_jitter(text: str) -> Jitter:
    """`0.1` (every kind) or `compute=10%,prefill=0.1,network=0.05,share=10%` (or
    `share=sawtooth`); ValueError says why."""
    text = text.strip()
    if "=" not in text:
        cv = parse_fraction(text)
        return Jitter(cv, cv, cv, cv)
    values: dict[str, float | None] = {}
    for part in text.split(","):
        key, _, raw = part.partition("=")
        key, raw = key.strip(), raw.strip()
        if key not in KINDS:
            raise ValueError(f"unknown kind {key!r} (kinds: {', '.join(KINDS)})")
        if key in values:
            raise ValueError(f"{key} given twice")
        values[key] = None if key == "share" and raw == SAWTOOTH else parse_fraction(raw)
    return Jitter(values.get("compute") or 0.0, values.get("prefill") or 0.0,
                  values.get("network") or 0.0, values.get("share"))


def _sigma(cv: float) -> float:
    """The lognormal's sigma whose mean-1 draws have coefficient of variation `cv`."""
    return math.sqrt(math.log1p(cv * cv))


_STANDARD = NormalDist()


class Noise:
    """The draws of one run: a stream per kind, so that adding network noise leaves the
    compute draws of the same seed as they were. A transfer's share is drawn from the
    transfer's identity instead (`share`), not from its place in the run's order: the same
    message weighs the same whatever else a plan, a policy or a link's rate changes around
    it, so two runs compared on one seed differ by what was changed, not by the noise."""

    def __init__(self, jitter: Jitter) -> None:
        self.jitter = jitter
        self.sigma = {kind: _sigma(getattr(jitter, kind) or 0.0) for kind in KINDS}
        self.streams = {kind: random.Random(f"{jitter.seed}:{kind}") for kind in KINDS}

    def factor(self, kind: NoiseKind) -> float:
        sigma = self.sigma[kind]
        if sigma == 0.0:
            return 1.0
        return self.streams[kind].lognormvariate(-sigma * sigma / 2, sigma)

    def share_cv(self, sawtooth: float) -> float:
        """The CV of a pair's shares: the run's, or with `share=sawtooth` the pair's
        congestion control's (`sawtooth`)."""
        return self.jitter.share if self.jitter.share is not None else sawtooth

    def share(self, sawtooth: float, identity: str) -> float:
        """A transfer's share factor at share_cv(sawtooth); `identity` names the transfer
        within the run (its pair, kind and number there)."""
        cv = self.share_cv(sawtooth)
        if cv == 0.0:
            return 1.0
        sigma = _sigma(cv)
        digest = hashlib.blake2b(f"{self.jitter.seed}:{identity}".encode(), digest_size=8)
        uniform = (int.from_bytes(digest.digest(), "big") + 0.5) / 2.0 ** 64
        return math.exp(sigma * _STANDARD.inv_cdf(uniform) - sigma * sigma / 2)
