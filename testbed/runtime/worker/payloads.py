"""A collective's payload in real compute: fp32 values as they go on the wire (dense,
cast, blockwise-quantized or top-k) and a member's side of the ring over them.

Quantization is blockwise absmax (testbed.plan.collective.QUANT_BLOCK elements per fp32
scale), symmetric, round to nearest even: int8 in [-127, 127], int4 in [-7, 7] packed two
to a byte (low nibble first). A chunk on the wire is its values then its scales. Top-k
sends the k = ceil(P% of the elements) largest |values| (ties by lower index) as int32
indices then fp32 values. Real compute trains in fp32, so a payload of the job's dtype
('') is fp32 here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from testbed.plan.collective import QUANT_BLOCK, QUANTIZED_BITS, topk_fraction
from testbed.runtime.worker.allreduce import Wire, chunk_bounds

_CASTS = {"": torch.float32, "fp32": torch.float32, "bf16": torch.bfloat16,
          "fp16": torch.float16}


def encode(values: torch.Tensor, payload: str) -> bytes:
    """Flat fp32 `values` as `payload` on the wire (a dense or quantized one)."""
    if payload in QUANTIZED_BITS:
        return _quantize(values, QUANTIZED_BITS[payload])
    return _raw(values.to(_CASTS[payload]))


def decode(data: Wire, elements: int, payload: str) -> torch.Tensor:
    """What `encode` wrote, back as fp32."""
    if payload in QUANTIZED_BITS:
        return _dequantize(data, elements, QUANTIZED_BITS[payload])
    dtype = _CASTS[payload]
    if not elements:
        return torch.zeros(0)
    return torch.frombuffer(bytearray(data), dtype=dtype).to(torch.float32)


def roundtrip(values: torch.Tensor, payload: str) -> torch.Tensor:
    """`values` as a receiver reads them: what compressing them lost is the difference."""
    return decode(encode(values, payload), values.numel(), payload)


def _raw(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(torch.uint8).numpy().tobytes()


def _blocks(values: torch.Tensor) -> torch.Tensor:
    padded = torch.zeros(math.ceil(values.numel() / QUANT_BLOCK) * QUANT_BLOCK)
    padded[: values.numel()] = values
    return padded.view(-1, QUANT_BLOCK)


def _quantize(values: torch.Tensor, bits: int) -> bytes:
    levels = 2 ** (bits - 1) - 1
    blocks = _blocks(values)
    scales = blocks.abs().amax(dim=1) / levels
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(blocks / safe[:, None]).clamp(-levels, levels).to(torch.int8)
    q = q.reshape(-1)[: values.numel()]
    if bits == 4:
        nibbles = (q + 8).to(torch.uint8)
        if nibbles.numel() % 2:
            nibbles = torch.cat([nibbles, torch.tensor([8], dtype=torch.uint8)])
        packed = nibbles[0::2] | (nibbles[1::2] << 4)
        return _raw(packed) + _raw(scales)
    return _raw(q) + _raw(scales)


def _dequantize(data: Wire, elements: int, bits: int) -> torch.Tensor:
    if not elements:
        return torch.zeros(0)
    raw = bytearray(data)
    nvalues = math.ceil(elements * bits / 8)
    scales = torch.frombuffer(raw, dtype=torch.float32, offset=nvalues)
    if bits == 4:
        packed = torch.frombuffer(raw, dtype=torch.uint8, count=nvalues)
        nibbles = torch.stack([packed & 0xF, packed >> 4], dim=1).reshape(-1)[:elements]
        q = nibbles.to(torch.int8) - 8
    else:
        q = torch.frombuffer(raw, dtype=torch.int8, count=nvalues)
    per_element = scales.repeat_interleave(QUANT_BLOCK)[:elements]
    return q.to(torch.float32) * per_element


def topk_encode(values: torch.Tensor, fraction: float) -> bytes:
    k = math.ceil(values.numel() * fraction)
    # a stable sort of -|v|: the largest first, ties by lower index
    order = torch.sort(-values.abs(), stable=True).indices[:k]
    indices = torch.sort(order).values
    return _raw(indices.to(torch.int32)) + _raw(values[indices])


def topk_decode(data: Wire, elements: int) -> torch.Tensor:
    raw = bytearray(data)
    k = len(raw) // 8
    out = torch.zeros(elements)
    if k:
        indices = torch.frombuffer(raw, dtype=torch.int32, count=k).to(torch.long)
        out[indices] = torch.frombuffer(raw, dtype=torch.float32, offset=4 * k)
    return out


def lossy(payload: str) -> bool:
    """Whether a payload loses what it cannot carry (error feedback keeps it)."""
    return payload in QUANTIZED_BITS or topk_fraction(payload) is not None


def compressed(values: torch.Tensor, payload: str) -> torch.Tensor:
    """What a member's `values` become in `payload`, as the others read them."""
    fraction = topk_fraction(payload)
    if fraction is not None:
        return topk_decode(topk_encode(values, fraction), values.numel())
    return roundtrip(values, payload)


@dataclass
class Dense:
    """A member's fp32 values in a ring all-reduce: chunks of whole quantization blocks,
    each hop decoding what comes in and adding it in fp32."""

    values: torch.Tensor
    parts: int
    payload: str

    def __post_init__(self) -> None:
        self.bounds = chunk_bounds(self.values.numel(), self.parts, QUANT_BLOCK)

    def _slice(self, chunk: int) -> torch.Tensor:
        start, end = self.bounds[chunk]
        return self.values[start:end]

    def wire(self, chunk: int) -> Wire:
        return encode(self._slice(chunk), self.payload)

    def add(self, chunk: int, data: Wire) -> None:
        mine = self._slice(chunk)
        mine += decode(data, mine.numel(), self.payload)

    def settle(self, chunk: int) -> Wire:
        data = self.wire(chunk)
        self.take(chunk, bytearray(data))
        return data

    def take(self, chunk: int, data: Wire) -> None:
        mine = self._slice(chunk)
        mine.copy_(decode(data, mine.numel(), self.payload))

    def whole(self) -> Wire:
        raise NotImplementedError(_REDUCED)

    def gathered(self, payloads: list[Wire]) -> None:
        raise NotImplementedError(_REDUCED)


@dataclass
class Sparse:
    """A member's top-k pairs in a ring all-gather; every member sums all of them in ring
    order, in fp32, so all hold the same sum."""

    values: torch.Tensor
    fraction: float

    def whole(self) -> Wire:
        return topk_encode(self.values, self.fraction)

    def gathered(self, payloads: list[Wire]) -> None:
        total = torch.zeros_like(self.values)
        for payload in payloads:
            total += topk_decode(payload, total.numel())
        self.values = total

    def wire(self, chunk: int) -> Wire:
        raise NotImplementedError(_GATHERED)

    def add(self, chunk: int, data: Wire) -> None:
        raise NotImplementedError(_GATHERED)

    def settle(self, chunk: int) -> Wire:
        raise NotImplementedError(_GATHERED)

    def take(self, chunk: int, data: Wire) -> None:
        raise NotImplementedError(_GATHERED)


_GATHERED = "a sparse payload is gathered, not reduced in a ring"
_REDUCED = "a dense payload is reduced in a ring, not gathered"
