"""A collective's payload in real compute: fp32 values as they go on the wire (dense,
cast, blockwise-quantized or top-k), and a member's side of the collective over them.

Quantization is blockwise absmax (testbed.plan.collective.QUANT_BLOCK elements per fp32
scale), symmetric, round to nearest even: int8 in [-127, 127], int4 in [-7, 7] packed two
to a byte (low nibble first). fp4 is the Streaming DiLoCo paper's 4-bit float, E3M0: a
nibble of a sign bit (high) and a 3-bit exponent e, the value 0 for e = 0 and else
2^(e - 7) times the block's scale (its absmax), e taken so that the value is the nearest
to the original, a tie going to the larger magnitude; two to a byte, low nibble first.
A chunk on the wire is its values then its scales.
Top-k sends the k = ceil(P% of the elements) largest |values| (ties by lower index) as
int32 indices then fp32 values. Real compute trains in fp32, so a payload of the job's
dtype ('') is fp32 here.

The codec computes on the values' own device (a GPU's, where training runs on one) and
crosses to the host only at the bytes: what is encoded is copied to the CPU as it
becomes bytes, and what is decoded is read on the CPU and moved to the device asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from testbed.emulator.runtime.worker.collectives.allreduce import Wire, chunk_bounds
from testbed.plan.collective import (
    FLOAT4,
    FP4_EXPONENTS,
    QUANT_BLOCK,
    QUANTIZED_BITS,
    quantized_bits,
    topk_fraction,
)

_CASTS = {"": torch.float32, "fp32": torch.float32, "bf16": torch.bfloat16,
          "fp16": torch.float16}
HOST = torch.device("cpu")


def encode(values: torch.Tensor, payload: str) -> bytes:
    """Flat fp32 `values`, on any device, as `payload` on the wire."""
    fraction = topk_fraction(payload)
    if fraction is not None:
        return _topk(values, fraction)
    if payload == FLOAT4:
        return _float4(values)
    if payload in QUANTIZED_BITS:
        return _quantize(values, QUANTIZED_BITS[payload])
    return _raw(values.to(_CASTS[payload]))


def decode(data: Wire, elements: int, payload: str, device: torch.device = HOST
           ) -> torch.Tensor:
    """What `encode` wrote, back as fp32 on `device`."""
    if topk_fraction(payload) is not None:
        return _untopk(data, elements, device)
    if payload == FLOAT4:
        return _unfloat4(data, elements, device)
    if payload in QUANTIZED_BITS:
        return _dequantize(data, elements, QUANTIZED_BITS[payload], device)
    if not elements:
        return torch.zeros(0, device=device)
    return _host(bytearray(data), _CASTS[payload]).to(device).to(torch.float32)


def compressed(values: torch.Tensor, payload: str) -> torch.Tensor:
    """`values` as a receiver reads them, on their own device: what compressing them lost
    is the difference."""
    return decode(encode(values, payload), values.numel(), payload, values.device)


def lossy(payload: str) -> bool:
    """Whether a payload loses what it cannot carry (error feedback keeps it)."""
    return quantized_bits(payload) is not None or topk_fraction(payload) is not None


def _raw(tensor: torch.Tensor) -> bytes:
    """The bytes boundary: the only place a tensor leaves its device."""
    return tensor.detach().contiguous().to(HOST).view(torch.uint8).numpy().tobytes()


def _host(raw: bytearray, dtype: torch.dtype, count: int = -1, offset: int = 0
          ) -> torch.Tensor:
    """Received bytes (a copy of them, which torch may write) as a host tensor."""
    return torch.frombuffer(raw, dtype=dtype, count=count, offset=offset)


def _blocks(values: torch.Tensor) -> torch.Tensor:
    padded = torch.zeros(math.ceil(values.numel() / QUANT_BLOCK) * QUANT_BLOCK,
                         dtype=values.dtype, device=values.device)
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
            nibbles = torch.cat([nibbles, nibbles.new_full((1,), 8)])
        packed = nibbles[0::2] | (nibbles[1::2] << 4)
        return _raw(packed) + _raw(scales)
    return _raw(q) + _raw(scales)


def _dequantize(data: Wire, elements: int, bits: int, device: torch.device) -> torch.Tensor:
    if not elements:
        return torch.zeros(0, device=device)
    raw = bytearray(data)
    nvalues = math.ceil(elements * bits / 8)
    scales = _host(raw, torch.float32, offset=nvalues).to(device)
    if bits == 4:
        packed = _host(raw, torch.uint8, count=nvalues).to(device)
        nibbles = torch.stack([packed & 0xF, packed >> 4], dim=1).reshape(-1)[:elements]
        q = nibbles.to(torch.int8) - 8
    else:
        q = _host(raw, torch.int8, count=nvalues).to(device)
    per_element = scales.repeat_interleave(QUANT_BLOCK)[:elements]
    return q.to(torch.float32) * per_element


def _fp4_levels(device: torch.device) -> torch.Tensor:
    """E3M0's magnitudes by exponent field: 0, then 2^-6 ... 2^0."""
    exponents = torch.arange(1, FP4_EXPONENTS + 1, device=device, dtype=torch.float32)
    return torch.cat([torch.zeros(1, device=device), torch.pow(2.0, exponents - 7)])


def _float4(values: torch.Tensor) -> bytes:
    blocks = _blocks(values)
    scales = blocks.abs().amax(dim=1)
    safe = torch.where(scales > 0, scales, torch.ones_like(scales))
    scaled = (blocks / safe[:, None]).reshape(-1)[: values.numel()]
    levels = _fp4_levels(values.device)
    distance = (scaled.abs()[:, None] - levels[None, :]).abs()
    # the nearest level, a tie to the larger: argmin over the levels from the largest down
    nearest = levels.numel() - 1 - torch.argmin(distance.flip(1), dim=1)
    sign = ((scaled < 0) & (nearest > 0)).to(torch.uint8)
    nibbles = (sign << 3) | nearest.to(torch.uint8)
    if nibbles.numel() % 2:
        nibbles = torch.cat([nibbles, nibbles.new_zeros(1)])
    return _raw(nibbles[0::2] | (nibbles[1::2] << 4)) + _raw(scales)


def _unfloat4(data: Wire, elements: int, device: torch.device) -> torch.Tensor:
    if not elements:
        return torch.zeros(0, device=device)
    raw = bytearray(data)
    nvalues = math.ceil(elements / 2)
    scales = _host(raw, torch.float32, offset=nvalues).to(device)
    packed = _host(raw, torch.uint8, count=nvalues).to(device)
    nibbles = torch.stack([packed & 0xF, packed >> 4], dim=1).reshape(-1)[:elements]
    magnitude = _fp4_levels(device)[(nibbles & 0x7).to(torch.long)]
    signed = torch.where((nibbles & 0x8) > 0, -magnitude, magnitude)
    return signed * scales.repeat_interleave(QUANT_BLOCK)[:elements]


def _topk(values: torch.Tensor, fraction: float) -> bytes:
    k = math.ceil(values.numel() * fraction)
    # a stable sort of -|v|: the largest first, ties by lower index
    order = torch.sort(-values.abs(), stable=True).indices[:k]
    indices = torch.sort(order).values
    return _raw(indices.to(torch.int32)) + _raw(values[indices])


def _untopk(data: Wire, elements: int, device: torch.device) -> torch.Tensor:
    raw = bytearray(data)
    k = len(raw) // 8
    out = torch.zeros(elements, device=device)
    if k:
        indices = _host(raw, torch.int32, count=k).to(device).to(torch.long)
        out[indices] = _host(raw, torch.float32, offset=4 * k).to(device)
    return out


@dataclass
class Dense:
    """A member's fp32 values (on the host) in a ring all-reduce: chunks of whole
    quantization blocks, each hop decoding what comes in and adding it in fp32, then
    sending the partial sum on in the payload (a quantized one requantized: the ring
    serves what keeps no error feedback, uncompressed gradients and delta syncs;
    testbed.plan.collective.Collective.gathers)."""

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
class Gathered:
    """A member's payload compressed once (quantized or top-k), in a ring all-gather:
    every member decodes every member's payload and sums them in ring order, in fp32 on
    the host, so all hold the same sum and the only error in it is each member's own
    compression (which its error feedback keeps)."""

    mine: bytes
    elements: int
    payload: str
    values: torch.Tensor | None = None
    """The sum, once gathered."""

    def whole(self) -> Wire:
        return self.mine

    def gathered(self, payloads: list[Wire]) -> None:
        total = torch.zeros(self.elements)
        for payload in payloads:
            total += decode(payload, self.elements, self.payload)
        self.values = total

    def wire(self, chunk: int) -> Wire:
        raise NotImplementedError(_GATHERED)

    def add(self, chunk: int, data: Wire) -> None:
        raise NotImplementedError(_GATHERED)

    def settle(self, chunk: int) -> Wire:
        raise NotImplementedError(_GATHERED)

    def take(self, chunk: int, data: Wire) -> None:
        raise NotImplementedError(_GATHERED)


_GATHERED = "a compressed gradient payload is gathered, not reduced in a ring"
_REDUCED = "a ring's payload is reduced, not gathered"
