"""What an all-reduce reduces, which part of the parameters, in which payload, among whom.

Every-step data parallelism all-reduces a stage's whole gradient across all replicas;
the DiLoCo family syncs parameter deltas (pseudo-gradients) every H steps, a fragment of
the parameters at a time (Streaming DiLoCo), quantized, or among the replicas of one
datacenter only. Either may go in buckets, as torch's DistributedDataParallel reduces
gradients: bucket k of N is the k-th N-th of what the collective covers, in the order the
backward produces it (testbed.plan.buckets), so that a bucket's all-reduce can start as
soon as its layers' gradients are there. A `Collective` says which; its text form rides
on the action (`0ALLREDUCE[delta,f1/4,int4]`, `0ALLREDUCE_START[b2/8]`). Pure.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
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
"""Blockwise absmax integer formats, by their bits per value."""
FLOAT4 = "fp4"
"""4-bit floats, E3M0 (1 sign bit, 3 exponent bits, no mantissa): the Streaming DiLoCo
paper's format for outer gradients (arXiv 2501.18512, section 2.3)."""
FP4_EXPONENTS = 7
"""E3M0's nonzero magnitudes: exponent field 1 to 7 is 2^(e - 7) of the block's scale,
2^-6 to 1; field 0 is zero."""
QUANT_BLOCK = 256
"""Elements sharing one fp32 scale in a quantized payload (blockwise absmax)."""
TOPK_INDEX_BYTES = 4
_TOPK = re.compile(r"top(\d+(?:\.\d+)?)%")
PAYLOADS = (*DENSE_BYTES, *QUANTIZED_BITS, FLOAT4, "topP%")
"""Payload names, for messages; topP% is top-k with k = P% of the elements."""


def quantized_bits(payload: str) -> int | None:
    """Bits per value of a blockwise-scaled payload (int8, int4, fp4), None otherwise."""
    if payload == FLOAT4:
        return 4
    return QUANTIZED_BITS.get(payload)


def check_payload(payload: str) -> str:
    """`payload` if known ('' means the job's dtype); ValueError otherwise."""
    if payload == "" or payload in DENSE_BYTES or quantized_bits(payload) is not None:
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
            text += (", two to a byte: an integer format, not the 4-bit float (fp4, E3M0) "
                     "the Streaming DiLoCo paper sends")
        return text
    if payload == FLOAT4:
        return (f"4-bit floats E3M0 (the Streaming DiLoCo paper's): a sign bit and a 3-bit "
                f"exponent, each value 0 or +-2^-6 to 2^0 times an fp32 scale (the absmax of "
                f"its {QUANT_BLOCK} values), rounded to the nearest, two to a byte")
    return (f"top-k: the {payload[3:]} largest magnitudes, as (int32 index, value) pairs "
            "in the job's dtype")


def bucket_range(values: int, bucket: int, buckets: int) -> tuple[int, int]:
    """[start, end) of bucket `bucket` of `buckets` among `values` in backward order: the
    k-th N-th of them, as even as whole values allow."""
    return bucket * values // buckets, (bucket + 1) * values // buckets


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
    bits = quantized_bits(payload)
    if bits is not None:
        return math.ceil(elements * bits / 8) + 4 * math.ceil(elements / QUANT_BLOCK)
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
    """fp32, bf16, fp16, int8, int4, fp4 or topP% (see PAYLOADS); '' is the job's dtype."""
    scope: Scope = Scope.ALL
    """Which replicas reduce together: all, or those in one datacenter."""
    bucket: int = 0
    """Which bucket (see `buckets`)."""
    buckets: int = 1
    """Bucket `bucket` of `buckets` of the fragment: the bucket-th of `buckets` equal parts
    of its values in the order the backward produces them (testbed.plan.buckets); 0 of 1
    is all of it."""

    def __post_init__(self) -> None:
        if self.fragments < 1 or not 0 <= self.fragment < self.fragments:
            raise ValueError(f"fragment {self.fragment} of {self.fragments} does not exist")
        if self.buckets < 1 or not 0 <= self.bucket < self.buckets:
            raise ValueError(f"bucket {self.bucket} of {self.buckets} does not exist")
        check_payload(self.payload)

    @property
    def whole(self) -> bool:
        """Whether it covers all the stage's parameters (one fragment)."""
        return self.fragments == 1

    @property
    def bucketed(self) -> bool:
        """Whether it is one of several buckets of its fragment."""
        return self.buckets > 1

    def in_bucket(self, bucket: int, buckets: int) -> Collective:
        """The same collective, of bucket `bucket` of `buckets` only."""
        return replace(self, bucket=bucket, buckets=buckets)

    @property
    def unbucketed(self) -> Collective:
        """The collective its bucket is part of (the whole fragment)."""
        return replace(self, bucket=0, buckets=1)

    @property
    def gathers(self) -> bool:
        """Whether every member's payload is gathered (a ring all-gather: n-1 steps of
        one member's bytes) rather than summed in a ring all-reduce (2(n-1) steps of 1/n).

        A quantized payload (int8, int4, fp4) is, each member's quantized once and every
        member summing all of them in fp32 after dequantizing. For compressed gradients
        error feedback is correct only when a member's own compression is the only error
        made on its values, for the residual it keeps is that error (EF-SGD: Seide et al.
        2014, "1-Bit Stochastic Gradient Descent"; Karimireddy et al. 2019, "Error
        Feedback Fixes SignSGD and other Gradient Compression Schemes", arXiv
        1901.09847); for deltas it is what Streaming DiLoCo does with its 4-bit outer
        gradients: only what is communicated is low precision, the accumulation is in
        fp32 (arXiv 2501.18512, section 2.3). A ring would requantize partial sums at
        every hop, an error nobody keeps; top-k pairs do not add up in a ring at all.
        Dense payloads (the job's dtype, fp32, bf16, fp16) go round a ring all-reduce,
        summed in their own precision at each hop, as NCCL sums them."""
        if topk_fraction(self.payload) is not None:
            return True
        return quantized_bits(self.payload) is not None

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
        if (self.bucket, self.buckets) != (implied.bucket, implied.buckets):
            parts.append(f"b{self.bucket}/{self.buckets}")
        return ",".join(parts)

    @classmethod
    def parse(cls, text: str, implied: Collective | None = None) -> Collective:
        """From the text between an action's brackets: `delta,f1/4,int4,dc,b0/3` in any
        order, each part at most once; what it leaves out is as in `implied`."""
        values: dict[str, object] = {}

        def put(key: str, value: object, part: str) -> None:
            if key in values:
                raise ValueError(f"{part!r}: {key} given twice")
            values[key] = value

        for raw in text.split(","):
            part = raw.strip()
            fragment = re.fullmatch(r"f(\d+)/(\d+)", part)
            bucket = re.fullmatch(r"b(\d+)/(\d+)", part)
            if part in (r.value for r in Reduces):
                put("reduces", Reduces(part), part)
            elif part in (s.value for s in Scope):
                put("scope", Scope(part), part)
            elif fragment:
                put("fragment", int(fragment.group(1)), part)
                values["fragments"] = int(fragment.group(2))
            elif bucket:
                put("bucket", int(bucket.group(1)), part)
                values["buckets"] = int(bucket.group(2))
            elif part == "dtype":
                put("payload", "", part)
            elif part:
                try:
                    put("payload", check_payload(part), part)
                except ValueError:
                    raise ValueError(
                        f"{part!r} is not grad/delta, fK/N, a payload ({', '.join(PAYLOADS)}), "
                        "all/dc or bK/N") from None
        base = implied or cls()
        return cls(**{**base.__dict__, **values})


EVERY_STEP = Collective()
"""Every-step data parallelism: the whole gradient, across all replicas."""
