"""Inference prefill requests: arrivals, how long a prefill takes, where bubbles are, and
what a dedicated prefill cluster would give. Pure: both backends and the policies use it."""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.compute import kv_cache_bytes, prefill_flops
from testbed.job import InferenceWorkload
from testbed.policy.base import Request
from testbed.topology.model import GpuType


def arrivals(workload: InferenceWorkload, seed: int) -> Iterator[Request]:
    """Requests in arrival order: the trace, or Poisson arrivals with prompt lengths drawn
    from the workload's distribution (seeded, so runs repeat); endless unless a trace."""
    if workload.trace is not None:
        yield from (Request(i, t, n) for i, (t, n) in enumerate(workload.trace))
        return
    rng = random.Random(seed * 7919 + 17)
    now, index = 0.0, 0
    while workload.arrival_rate > 0:
        now += rng.expovariate(workload.arrival_rate)
        yield Request(index, now, prompt_length(workload, rng))
        index += 1


def prompt_length(workload: InferenceWorkload, rng: random.Random) -> int:
    prompt = workload.prompt
    if prompt.distribution == "fixed":
        return prompt.low
    if prompt.distribution == "uniform":
        return rng.randint(prompt.low, prompt.high)
    value = rng.lognormvariate(math.log(prompt.median), prompt.sigma)
    return max(1, min(prompt.high, round(value)))


def modeled_prefill_s(workload: InferenceWorkload, gpu: GpuType, prompt_len: int) -> float:
    return prefill_flops(workload.model, prompt_len) / gpu.sustained_flops


def kv_bytes(workload: InferenceWorkload, prompt_len: int) -> int:
    return kv_cache_bytes(workload.model, prompt_len)


@dataclass
class PrefillModel:
    """Prefill time as a + b*L + c*L^2 in the prompt length L, fitted by least squares to
    measured prefills; the FLOP model until three distinct lengths have been measured."""

    prior: Mapping[str, float]
    """Coefficients from the FLOP model: {"a":..., "b":..., "c":...}."""
    samples: list[tuple[int, float]] = field(default_factory=list)
    coefficients: tuple[float, float, float] = (0.0, 0.0, 0.0)

    def __post_init__(self) -> None:
        self.coefficients = (self.prior["a"], self.prior["b"], self.prior["c"])

    @classmethod
    def from_flops(cls, workload: InferenceWorkload, gpu: GpuType) -> PrefillModel:
        points = [(n, modeled_prefill_s(workload, gpu, n)) for n in (64, 512, 2048)]
        a, b, c = fit_quadratic(points)
        return cls({"a": a, "b": b, "c": c})

    def observe(self, prompt_len: int, seconds: float) -> None:
        self.samples.append((prompt_len, seconds))
        if len({n for n, _ in self.samples}) >= 3:
            self.coefficients = fit_quadratic(self.samples[-200:])

    def __call__(self, prompt_len: int) -> float:
        a, b, c = self.coefficients
        return max(0.0, a + b * prompt_len + c * prompt_len**2)


def fit_quadratic(points: Sequence[tuple[float, float]]) -> tuple[float, float, float]:
    """Least-squares a + b x + c x^2 through the points (normal equations, 3x3)."""
    sums = [sum(x**k for x, _ in points) for k in range(5)]
    rhs = [sum(y * x**k for x, y in points) for k in range(3)]
    matrix = [[sums[i + j] for j in range(3)] for i in range(3)]
    return _solve3(matrix, rhs)


def _solve3(m: list[list[float]], v: list[float]) -> tuple[float, float, float]:
    a = [[*row[:], value] for row, value in zip(m, v, strict=True)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        if abs(a[col][col]) < 1e-30:
            return (statistics.fmean(y for y in v) if v else 0.0, 0.0, 0.0)
        for r in range(3):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
    return (a[0][3] / a[0][0], a[1][3] / a[1][1], a[2][3] / a[2][2])


def predicted_bubbles(spans: Iterable[Mapping[str, Any]], history: int = 3
                      ) -> dict[tuple[str, int], float]:
    """How long each GPU waits at each receive (keyed by its position in the action list),
    from the last `history` iterations measured: the shortest, so a prefill that fits the
    prediction fits the bubble. Bubbles repeat every iteration because the schedule does."""
    waits: dict[tuple[str, int], list[tuple[int, float]]] = {}
    for span in spans:
        if span["kind"] == "recv" and span.get("action") is not None:
            waits.setdefault((span["gpu"], span["action"]), []).append(
                (span["iteration"], span["end"] - span["start"]))
    out = {}
    for key, values in waits.items():
        values.sort()
        out[key] = min(v for _, v in values[-history:])
    return out


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def dedicated_ttft(requests: Sequence[Request], gpus: int, prefill_s: Any,
                   kv_s: Any) -> list[float]:
    """TTFT on a dedicated prefill cluster of `gpus` GPUs serving first come first served:
    wait for a free GPU, prefill, ship the KV cache."""
    free = [0.0] * gpus
    heapq.heapify(free)
    out = []
    for request in sorted(requests, key=lambda r: r.arrival):
        start = max(request.arrival, heapq.heappop(free))
        done = start + prefill_s(request.prompt_len)
        heapq.heappush(free, done)
        out.append(done + kv_s(request.prompt_len) - request.arrival)
    return out
