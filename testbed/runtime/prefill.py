"""Real inference prefill in torch: run a prompt through the inference model, keep each
layer's keys and values (the KV cache a decode server needs) and the first token."""

from __future__ import annotations

import struct

import torch

from testbed.job import ModelShape
from testbed.runtime.model import Block, build_model


class Prefiller:
    def __init__(self, shape: ModelShape, seed: int, device: torch.device) -> None:
        self.shape = shape
        self.device = device
        self.model = build_model(shape, seed).to(device).eval()
        self._captured: list[torch.Tensor] = []
        for block in self.model.blocks:
            assert isinstance(block, Block)
            block.kv.register_forward_hook(lambda _m, _i, out: self._captured.append(out))

    def run(self, request: int, prompt_len: int) -> bytes:
        """The KV cache (bf16, every layer) followed by the first generated token."""
        length = max(1, min(prompt_len, self.shape.seq_len))
        generator = torch.Generator().manual_seed(request)
        tokens = torch.randint(self.shape.vocab, (1, length), generator=generator)
        self._captured.clear()
        with torch.no_grad():
            logits = self.model(tokens.to(self.device))
        first = int(logits[0, -1].argmax())
        kv = torch.cat([c.reshape(-1) for c in self._captured]).to(torch.bfloat16)
        self._captured.clear()
        return kv.view(torch.uint8).cpu().numpy().tobytes() + struct.pack("!q", first)
