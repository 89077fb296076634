"""Real inference prefill in torch: run a prompt, or a chunk of it, through the inference
model, keeping each layer's keys and values (the KV cache a decode server needs, and the
next chunk attends to) and the first token."""

from __future__ import annotations

import struct

import torch

from testbed.emulator.runtime.worker.compute.model import Block, KeysValues, build_model
from testbed.job.model import ModelShape


class Prefiller:
    def __init__(self, shape: ModelShape, seed: int, device: torch.device) -> None:
        self.shape = shape
        self.device = device
        self.model = build_model(shape, seed).to(device).eval()
        self._cache: dict[int, list[KeysValues]] = {}
        """Requests chunked so far: every layer's keys and values."""

    def run(self, request: int, prompt_len: int, start: int = 0, end: int | None = None
            ) -> bytes | None:
        """Prefill tokens [start, end) of the request's prompt (seeded by its id), after
        the chunks before `start`. At the prompt's end: the KV cache (bf16, every layer)
        followed by the first generated token; None after an earlier chunk."""
        length = max(1, min(prompt_len, self.shape.seq_len))
        end = length if end is None else min(end, length)
        start = min(start, end - 1)
        generator = torch.Generator().manual_seed(request)
        tokens = torch.randint(self.shape.vocab, (1, length), generator=generator)
        past = self._cache.pop(request, None) if start else None
        model = self.model
        assert model.embed is not None and model.position is not None and model.head is not None
        with torch.no_grad():
            chunk = tokens[:, start:end].to(self.device)
            positions = torch.arange(start, end, device=self.device)
            x = model.embed(chunk) + model.position(positions)
            cache = []
            for i, block in enumerate(model.blocks):
                assert isinstance(block, Block)
                x, kv = block.attend(x, past[i] if past else None)
                cache.append(kv)
            if end < length:
                self._cache[request] = cache
                return None
            first = int(model.head(x[:, -1:])[0, -1].argmax())
        kv_bytes = torch.cat([t.reshape(-1) for kv in cache for t in kv]).to(torch.bfloat16)
        return kv_bytes.view(torch.uint8).cpu().numpy().tobytes() + struct.pack("!q", first)
