"""Inference prefill requests: arrivals, how long a prefill takes, where bubbles are, and
what a dedicated prefill cluster would give. Pure: both backends and the policies use it."""

from __future__ import annotations

import heapq
import math
import random
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from testbed.common.sizes import MAX_REQUESTS
from testbed.common.spans import is_wait
from testbed.errors import InputError
from testbed.job.model import InferenceWorkload
from testbed.plan.compute import kv_cache_bytes, prefill_flops
from testbed.policy.base import Chunk, Request
from testbed.topology.model import GpuType

WaitKey = tuple[str, int] | tuple[str, int, int]
"""Where a GPU waits: (GPU, index of the action) in program 0, as plans of one program
have always keyed their waits; (GPU, action, program) in another program of a cycle,
whose actions and waits are its own."""


def wait_key(gpu: str, action: int, program: int = 0) -> WaitKey:
    return (gpu, action) if program == 0 else (gpu, action, program)


def arrivals(workload: InferenceWorkload, seed: int) -> Iterator[Request]:
    """Requests in arrival order: the trace, or Poisson arrivals with prompt lengths drawn
    from the workload's distribution (seeded, so runs repeat); endless unless a trace, but
    a run that would take more than MAX_REQUESTS of them (each one is kept) is refused as
    it reaches them."""
    if workload.trace is not None:
        yield from (Request(i, t, n) for i, (t, n) in enumerate(workload.trace))
        return
    rng = random.Random(seed * 7919 + 17)
    now, index = 0.0, 0
    while workload.arrival_rate > 0:
        now += rng.expovariate(workload.arrival_rate)
        if index == MAX_REQUESTS:
            raise InputError(f"{workload.arrival_rate:,g} requests/s make {MAX_REQUESTS:,} "
                             f"requests by {now:.3g} s of the run, the most one run takes "
                             "(each is kept to its end): lower the rate, or run fewer "
                             "iterations", None, "inference.arrival_rate")
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


def modeled_prefill_s(workload: InferenceWorkload, gpu: GpuType, end: int,
                      start: int = 0) -> float:
    """Prompt tokens [start, end) on one GPU of this type, from FLOPs."""
    return prefill_flops(workload.model, end, start) / gpu.sustained_flops


def modeled_batch_s(workload: InferenceWorkload, gpu: GpuType, chunks: Iterable[Chunk]) -> float:
    """One pass over several chunks: FLOPs add up (a compute-bound prefill)."""
    return sum(modeled_prefill_s(workload, gpu, c.end, c.start) for c in chunks)


def kv_bytes(workload: InferenceWorkload, prompt_len: int) -> int:
    return kv_cache_bytes(workload.model, prompt_len)


def longest_prompt(workload: InferenceWorkload) -> int:
    """The longest prompt the workload can send."""
    if workload.trace is not None:
        return max((n for _, n in workload.trace), default=0)
    prompt = workload.prompt
    return prompt.low if prompt.distribution == "fixed" else prompt.high


@dataclass
class PrefillModel:
    """Prefill time of a pass as a + b*T + c*S, where T counts the prompt tokens it
    processes and S the sum over its chunks [s, e) of e^2 - s^2 (a whole prompt of L
    tokens: T = L, S = L^2), fitted by least squares to measured passes; the FLOP model
    until three distinct (T, S) have been measured. Satisfies `PrefillTimes`."""

    prior: Mapping[str, float]
    """Coefficients from the FLOP model: {"a":..., "b":..., "c":...}."""
    window: int = 200
    """Passes the fit looks back on."""
    samples: deque[tuple[int, int, float]] = field(default_factory=deque)
    coefficients: tuple[float, float, float] = (0.0, 0.0, 0.0)
    _sums: list[float] = field(default_factory=lambda: [0.0] * 9)
    """Over `samples`: the normal equations' sums 1, x, z, x^2, xz, z^2, y, xy, zy."""
    _distinct: bool = False

    def __post_init__(self) -> None:
        self.coefficients = (self.prior["a"], self.prior["b"], self.prior["c"])

    @classmethod
    def from_flops(cls, workload: InferenceWorkload, gpu: GpuType) -> PrefillModel:
        points = [(n, n * n, modeled_prefill_s(workload, gpu, n)) for n in (64, 512, 2048)]
        a, b, c = fit_prefill(points)
        return cls({"a": a, "b": b, "c": c})

    def observe(self, prompt_len: int, seconds: float) -> None:
        """A whole prompt took `seconds`."""
        self.observe_batch((Chunk(Request(-1, 0.0, prompt_len), 0, prompt_len),), seconds)

    def observe_batch(self, chunks: Sequence[Chunk], seconds: float) -> None:
        """A pass took `seconds`: refit over the last `window` passes (kept as running
        sums, so each pass costs the same however many came before)."""
        sample = (*_regressors(chunks), seconds)
        self.samples.append(sample)
        self._add(sample, 1.0)
        if len(self.samples) > self.window:
            self._add(self.samples.popleft(), -1.0)
        if not self._distinct:
            self._distinct = len({(t, q) for t, q, _ in self.samples}) >= 3
        if self._distinct:
            self.coefficients = _solve_sums(self._sums, lambda: [s for *_, s in self.samples])

    def _add(self, sample: tuple[int, int, float], sign: float) -> None:
        for i, term in enumerate(_normal_terms(*sample)):
            self._sums[i] += sign * term

    def __call__(self, prompt_len: int) -> float:
        return self.chunk(0, prompt_len)

    def chunk(self, start: int, end: int) -> float:
        a, b, c = self.coefficients
        return max(0.0, a + b * (end - start) + c * (end * end - start * start))

    def batch(self, chunks: Sequence[Chunk]) -> float:
        if not chunks:
            return 0.0
        a, b, c = self.coefficients
        tokens, squares = _regressors(chunks)
        return max(0.0, a + b * tokens + c * squares)


def _regressors(chunks: Iterable[Chunk]) -> tuple[int, int]:
    tokens = squares = 0
    for c in chunks:
        tokens += c.end - c.start
        squares += c.end * c.end - c.start * c.start
    return tokens, squares


def fit_prefill(points: Sequence[tuple[float, float, float]]) -> tuple[float, float, float]:
    """Least-squares a + b x + c z through (x, z, y) points (normal equations, 3x3)."""
    sums = [0.0] * 9
    for x, z, y in points:
        for i, term in enumerate(_normal_terms(x, z, y)):
            sums[i] += term
    return _solve_sums(sums, lambda: [y for *_, y in points])


def _normal_terms(x: float, z: float, y: float) -> tuple[float, ...]:
    """One point's share of the normal equations' sums: 1, x, z, x^2, xz, z^2, y, xy, zy."""
    x, z = float(x), float(z)
    return (1.0, x, z, x * x, x * z, z * z, y, x * y, z * y)


def _solve_sums(sums: Sequence[float], ys: Callable[[], Sequence[float]]
                ) -> tuple[float, float, float]:
    """`ys`: the points' values, asked for only where the system is singular."""
    n, x, z, xx, xz, zz, y, xy, zy = sums
    return _solve3([[n, x, z], [x, xx, xz], [z, xz, zz]], [y, xy, zy], ys)


def _solve3(m: list[list[float]], v: list[float], ys: Callable[[], Sequence[float]]
            ) -> tuple[float, float, float]:
    a = [[*row[:], value] for row, value in zip(m, v, strict=True)]
    for col in range(3):
        pivot = max(range(col, 3), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        if abs(a[col][col]) < 1e-30:
            values = ys()
            return (statistics.fmean(values) if values else 0.0, 0.0, 0.0)
        for r in range(3):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
    return (a[0][3] / a[0][0], a[1][3] / a[1][1], a[2][3] / a[2][2])


def predicted_bubbles(spans: Iterable[Mapping[str, Any]], history: int = 3,
                      program_of: Callable[[int], int] | None = None) -> dict[WaitKey, float]:
    """How long each GPU waits at each receive and all-reduce (keyed by its position in
    the action list of its program: testbed.inference.bubbles.wait_key), from the last `history`
    iterations measured: the shortest, so a prefill that fits the prediction fits the
    bubble. Bubbles repeat every iteration that runs the same program because the
    schedule does. `program_of`: the plan's (Plan.program_of), for a plan of several."""
    waits: dict[WaitKey, list[tuple[int, float]]] = {}
    for span in spans:
        if is_wait(span) and span.get("action") is not None:
            waited = span.get("waited", span["end"] - span["start"])
            program = program_of(span["iteration"]) if program_of is not None else 0
            waits.setdefault(wait_key(span["gpu"], span["action"], program), []).append(
                (span["iteration"], waited))
    out = {}
    for key, values in waits.items():
        values.sort()
        out[key] = min(v for _, v in values[-history:])
    return out


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
