"""What an all-reduce reduces, which part of the parameters, in which payload, among whom.

Every-step data parallelism all-reduces a stage's whole gradient across all replicas;
the DiLoCo family syncs parameter deltas (pseudo-gradients) every H steps, a fragment of
the parameters at a time (Streaming DiLoCo), quantized, or among the replicas of one
datacenter only. A `Collective` says which; its text form rides on the action
(`0ALLREDUCE[delta,f1/4,int4]`). Pure.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from enum import StrEnum


class Reduces(StrEnum):
    """What the replicas sum (and then average)."""

    GRADIENTS = "grad"
    """This step's gradients, before the optimizer step (every-step data parallelism)."""
    DELTAS = "delta"
    """Outer parameters minus local ones since the last sync (DiLoCo's pseudo-gradients),
    for an outer optimizer step."""


class Scope(StrEnum):
    """Which replicas of a stage reduce together."""

    ALL = "all"
    """Every replica of the stage."""
    DC = "dc"
    """Those whose stage runs in the same datacenter (a DiLoCo worker that is itself
    data parallel inside its DC)."""


DENSE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0}
QUANTIZED_BITS = {"int8": 8, "int4": 4}
QUANT_BLOCK = 256
"""Elements sharing one fp32 scale in a quantized payload (blockwise absmax)."""
TOPK_INDEX_BYTES = 4
_TOPK = re.compile(r"top(\d+(?:\.\d+)?)%")
PAYLOADS = (*DENSE_BYTES, *QUANTIZED_BITS, "topP%")
"""Payload names, for messages; topP% is top-k with k = P% of the elements."""


def check_payload(payload: str) -> str:
    """`payload` if known ('' means the job's dtype); ValueError otherwise."""
    if payload == "" or payload in DENSE_BYTES or payload in QUANTIZED_BITS:
        return payload
    match = _TOPK.fullmatch(payload)
    if match and 0 < float(match.group(1)) <= 100:
        return payload
    raise ValueError(f"unknown payload {payload!r} (one of {', '.join(PAYLOADS)}, "
                     "P between 0 and 100)")


def payload_format(payload: str) -> str:
    """What `payload` is on the wire, in words (results name each payload a plan sends)."""
    if payload == "":
        return "the job's dtype"
    if payload in DENSE_BYTES:
        return {"fp32": "IEEE fp32 values", "bf16": "bfloat16 values",
                "fp16": "IEEE fp16 values"}[payload]
    if payload in QUANTIZED_BITS:
        levels = 2 ** (QUANTIZED_BITS[payload] - 1) - 1
        text = (f"blockwise absmax integers in [-{levels}, {levels}], an fp32 scale per "
                f"{QUANT_BLOCK} values")
        if payload == "int4":
            text += (", two to a byte: an integer format, not the 4-bit float (FP4, E3M0) "
                     "the Streaming DiLoCo paper sends")
        return text
    return (f"top-k: the {payload[3:]} largest magnitudes, as (int32 index, value) pairs "
            "in the job's dtype")


def topk_fraction(payload: str) -> float | None:
    """The fraction of elements a top-k payload sends; None for a dense one."""
    match = _TOPK.fullmatch(payload)
    return float(match.group(1)) / 100 if match else None


def payload_bytes(elements: int, payload: str, dtype_bytes: int) -> int:
    """Bytes one member's `elements` take in `payload` ('' = the job's dtype): dense
    values; quantized values with a 4-byte scale per QUANT_BLOCK; top-k (index, value) pairs
    with values in the job's dtype."""
    if payload == "":
        return elements * dtype_bytes
    if payload in DENSE_BYTES:
        return int(elements * DENSE_BYTES[payload])
    if payload in QUANTIZED_BITS:
        return math.ceil(elements * QUANTIZED_BITS[payload] / 8) + 4 * math.ceil(
            elements / QUANT_BLOCK)
    fraction = topk_fraction(payload)
    if fraction is None:
        raise ValueError(f"unknown payload {payload!r}")
    return math.ceil(elements * fraction) * (TOPK_INDEX_BYTES + dtype_bytes)


@dataclass(frozen=True, order=True)
class Collective:
    """One all-reduce's subject. The default is every-step data parallelism: the whole
    gradient, in the job's dtype, across all replicas."""

    reduces: Reduces = Reduces.GRADIENTS
    """What is summed: gradients, or parameter deltas since the last sync."""
    fragment: int = 0
    """Which fragment (see `fragments`)."""
    fragments: int = 1
    """Fragment `fragment` of `fragments` of the stage's parameters (testbed.job.fragments
    says which tensors); 0 of 1 is all of them."""
    payload: str = ""
    """fp32, bf16, fp16, int8, int4 or topP% (see PAYLOADS); '' is the job's dtype."""
    scope: Scope = Scope.ALL
    """Which replicas reduce together: all, or those in one datacenter."""

    def __post_init__(self) -> None:
        if self.fragments < 1 or not 0 <= self.fragment < self.fragments:
            raise ValueError(f"fragment {self.fragment} of {self.fragments} does not exist")
        check_payload(self.payload)

    @property
    def whole(self) -> bool:
        """Whether it covers all the stage's parameters (one fragment)."""
        return self.fragments == 1

    @property
    def gathers(self) -> bool:
        """Whether every member's payload is gathered (a ring all-gather: n-1 steps of
        one member's bytes) rather than summed in a ring all-reduce (2(n-1) steps of 1/n).

        Compressed gradients are, each member's compressed once: error feedback is
        correct only when a member's own compression is the only error made on its
        values, for the residual it keeps is that error (EF-SGD: Seide et al. 2014,
        "1-Bit Stochastic Gradient Descent"; Karimireddy et al. 2019, "Error Feedback
        Fixes SignSGD and other Gradient Compression Schemes", arXiv 1901.09847). A
        ring would requantize partial sums at every hop, an error no member keeps; top-k
        pairs do not add up in a ring at all. Deltas (DiLoCo's pseudo-gradients) keep
        no error feedback and stay on the ring whatever their payload: its bytes, and
        the rounding of their partial sums, which nothing carries over from one sync to
        the next."""
        if topk_fraction(self.payload) is not None:
            return True
        return self.reduces is Reduces.GRADIENTS and self.payload in QUANTIZED_BITS

    def __str__(self) -> str:
        return self.spelled(EVERY_STEP)

    def spelled(self, implied: Collective) -> str:
        """The text form, naming only what differs from `implied`."""
        parts = [] if self.reduces is implied.reduces else [self.reduces.value]
        if (self.fragment, self.fragments) != (implied.fragment, implied.fragments):
            parts.append(f"f{self.fragment}/{self.fragments}")
        if self.payload != implied.payload:
            parts.append(self.payload or "dtype")
        if self.scope is not implied.scope:
            parts.append(self.scope.value)
        return ",".join(parts)

    @classmethod
    def parse(cls, text: str, implied: Collective | None = None) -> Collective:
        """From the text between an action's brackets: `delta,f1/4,int4,dc` in any order,
        each part at most once; what it leaves out is as in `implied`."""
        values: dict[str, object] = {}

        def put(key: str, value: object, part: str) -> None:
            if key in values:
                raise ValueError(f"{part!r}: {key} given twice")
            values[key] = value

        for raw in text.split(","):
            part = raw.strip()
            fragment = re.fullmatch(r"f(\d+)/(\d+)", part)
            if part in (r.value for r in Reduces):
                put("reduces", Reduces(part), part)
            elif part in (s.value for s in Scope):
                put("scope", Scope(part), part)
            elif fragment:
                put("fragment", int(fragment.group(1)), part)
                values["fragments"] = int(fragment.group(2))
            elif part == "dtype":
                put("payload", "", part)
            elif part:
                try:
                    put("payload", check_payload(part), part)
                except ValueError:
                    raise ValueError(
                        f"{part!r} is not grad/delta, fK/N, a payload ({', '.join(PAYLOADS)}) "
                        "or all/dc") from None
        base = implied or cls()
        return cls(**{**base.__dict__, **values})


EVERY_STEP = Collective()
"""Every-step data parallelism: the whole gradient, across all replicas."""
