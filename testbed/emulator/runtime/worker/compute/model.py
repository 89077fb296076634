"""A small decoder-only transformer in torch, cut into pipeline stages, and the corpus it
learns from: seeded synthetic sequences, or a token file's. The only training code that
imports torch."""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import nn

from testbed.job.fragments import block_fragment, embedding_fragment, head_fragment, stage_blocks
from testbed.job.model import DataFile, InnerOptimizer, ModelShape
from testbed.job.tokens import TokenWindows, open_tokens

KeysValues = tuple[torch.Tensor, torch.Tensor]
"""One layer's keys and values, (batch, kv heads, positions, head dim) each."""


class Block(nn.Module):
    """Pre-norm attention + MLP block, causal. The MLP is the shape's: GELU(up) then down,
    or SwiGLU, SiLU(gate) x up then down."""

    def __init__(self, shape: ModelShape) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = shape.heads, shape.n_kv_heads, shape.head_dim
        self.norm1 = nn.LayerNorm(shape.hidden)
        self.q = nn.Linear(shape.hidden, shape.hidden)
        self.kv = nn.Linear(shape.hidden, 2 * self.kv_heads * self.head_dim)
        self.out = nn.Linear(shape.hidden, shape.hidden)
        self.norm2 = nn.LayerNorm(shape.hidden)
        self.gate = nn.Linear(shape.hidden, shape.ffn_hidden) if shape.mlp == "swiglu" else None
        self.up = nn.Linear(shape.hidden, shape.ffn_hidden)
        self.down = nn.Linear(shape.ffn_hidden, shape.hidden)

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            out: torch.Tensor = self.down(F.silu(self.gate(h)) * self.up(h))
        else:
            out = self.down(F.gelu(self.up(h)))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.attend(x, None)
        return out

    def attend(self, x: torch.Tensor, past: KeysValues | None
               ) -> tuple[torch.Tensor, KeysValues]:
        """The block over positions that follow those whose keys and values are `past`
        (a chunked prefill's KV cache; None from the start); also the keys and values of
        every position so far."""
        batch, seq, hidden = x.shape
        h = self.norm1(x)
        q = self.q(h).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(h).view(batch, seq, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)
        offset = 0
        if past is not None:
            offset = past[0].shape[2]
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        cache = (k, v)
        if self.kv_heads != self.heads:
            repeat = self.heads // self.kv_heads
            k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
        if offset == 0:
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # position offset + i sees keys 0 .. offset + i
            mask = (torch.arange(offset + seq, device=x.device)[None, :]
                    <= offset + torch.arange(seq, device=x.device)[:, None])
            attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.out(attn.transpose(1, 2).reshape(batch, seq, hidden))
        return x + self.mlp(self.norm2(x)), cache


class Stage(nn.Module):
    """Layers [first, last) of the model; the first stage embeds, the last one predicts."""

    def __init__(
        self,
        shape: ModelShape,
        blocks: list[Block],
        embed: nn.Embedding | None,
        position: nn.Embedding | None,
        head: nn.Sequential | None,
    ) -> None:
        super().__init__()
        self.embed, self.position, self.head = embed, position, head
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None and self.position is not None:
            positions = torch.arange(x.shape[1], device=x.device)
            x = self.embed(x) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(x)
        return x


def build_stages(shape: ModelShape, layers: tuple[int, ...], seed: int) -> list[Stage]:
    """Every stage of the model, initialized exactly as the whole model would be with
    `seed`; each worker keeps its own stage, so the pipeline equals one process. A tied
    output layer is the embedding's weight: the first and the last stage share it here,
    and hold a copy each in their own processes."""
    torch.manual_seed(seed)
    embed = nn.Embedding(shape.vocab, shape.hidden)
    position = nn.Embedding(shape.seq_len, shape.hidden)
    blocks = [Block(shape) for _ in range(shape.layers)]
    output = nn.Linear(shape.hidden, shape.vocab)
    if shape.tied_embeddings:
        output.weight = embed.weight
    head = nn.Sequential(nn.LayerNorm(shape.hidden), output)
    stages, first = [], 0
    for index, count in enumerate(layers):
        last = index == len(layers) - 1
        stages.append(
            Stage(
                shape,
                blocks[first : first + count],
                embed if index == 0 else None,
                position if index == 0 else None,
                head if last else None,
            )
        )
        first += count
    return stages


def parameter_fragments(stage: Stage, layers: tuple[int, ...], index: int,
                        fragments: int) -> dict[str, int]:
    """The fragment (of `fragments`) each parameter of stage `index` belongs to, by name,
    under testbed.job.fragments' rules: a block's parameters (its norms and biases too) with
    the block, the token and position embeddings with block 0's fragment, the final norm
    and output layer with the last block's."""
    blocks = stage_blocks(layers, index)
    out: dict[str, int] = {}
    for name, _ in stage.named_parameters():
        part, _, rest = name.partition(".")
        if part == "blocks":
            out[name] = block_fragment(blocks[int(rest.partition(".")[0])], fragments)
        elif part in ("embed", "position"):
            out[name] = embedding_fragment(fragments)
        elif part == "head":
            out[name] = head_fragment(sum(layers), fragments)
        else:
            raise ValueError(f"no fragment rule for parameter {name!r}")
    return out


def backward_order(stage: Stage, layers: tuple[int, ...], index: int) -> list[str]:
    """Stage `index`'s parameter names in the order its backward produces their gradients,
    by unit as testbed.plan.buckets orders them (the output layer, the blocks last to
    first, the embeddings), a unit's own parameters last to first."""
    blocks = stage_blocks(layers, index)

    def unit(name: str) -> int:
        part, _, rest = name.partition(".")
        if part == "head":
            return -1
        if part == "blocks":
            return sum(layers) - blocks[int(rest.partition(".")[0])]
        return sum(layers) + 1  # the embeddings, last

    names = [name for name, _ in stage.named_parameters()]
    position = {name: i for i, name in enumerate(names)}
    return sorted(names, key=lambda n: (unit(n), -position[n]))


def build_model(shape: ModelShape, seed: int) -> Stage:
    """The whole model in one piece (the single-process reference)."""
    return build_stages(shape, (shape.layers,), seed)[0]


def inner_optimizer(parameters: Iterable[nn.Parameter], settings: InnerOptimizer
                    ) -> torch.optim.AdamW:
    """The optimizer every real-compute stage (and the one-process reference) steps with
    (testbed.job.model.InnerOptimizer says why AdamW and these settings)."""
    return torch.optim.AdamW(parameters, lr=settings.lr, weight_decay=settings.weight_decay)


def loss_of(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Samples:
    """Numbered training sequences: sample `index` is the same wherever it is asked for,
    so a pipeline's first and last stage, every replica and the single-process reference
    see the same tokens."""

    def sample(self, index: int) -> torch.Tensor:
        """Sequence `index` (seq_len + 1 tokens: inputs and shifted targets)."""
        raise NotImplementedError

    def batch(self, first: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of samples first .. first + size - 1."""
        rows = torch.stack([self.sample(first + i) for i in range(size)])
        return rows[:, :-1], rows[:, 1:]


class Corpus(Samples):
    """Seeded synthetic token sequences with learnable structure: mostly each token follows
    from the previous one by a fixed permutation, sometimes a random token instead."""

    def __init__(self, vocab: int, seq_len: int, seed: int, noise: float = 0.1) -> None:
        self.vocab, self.seq_len, self.seed, self.noise = vocab, seq_len, seed, noise
        generator = torch.Generator().manual_seed(seed)
        self.successor = torch.randperm(vocab, generator=generator)

    def sample(self, index: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        tokens = torch.empty(self.seq_len + 1, dtype=torch.long)
        tokens[0] = int(torch.randint(self.vocab, (1,), generator=generator))
        noise = torch.rand(self.seq_len, generator=generator) < self.noise
        random_tokens = torch.randint(self.vocab, (self.seq_len,), generator=generator)
        for i in range(self.seq_len):
            nxt = self.successor[tokens[i]]
            tokens[i + 1] = random_tokens[i] if noise[i] else nxt
        return tokens


class FileCorpus(Samples):
    """A token file's windows (testbed.job.tokens), memory-mapped."""

    def __init__(self, data: DataFile, seq_len: int, seed: int) -> None:
        tokens = open_tokens(data.path, data.format)
        if len(tokens) != data.tokens:
            raise ValueError(f"{data.path} holds {len(tokens)} tokens, not the "
                             f"{data.tokens} it held when the job was read")
        self.windows = TokenWindows(tokens, seq_len, seed)

    def sample(self, index: int) -> torch.Tensor:
        return torch.from_numpy(self.windows.sample(index))


def make_corpus(shape: ModelShape, seed: int, data: DataFile | None) -> Samples:
    """The job's corpus: its data file's, or else the synthetic one. ValueError when the
    file cannot be read (here: a run across machines needs it on each)."""
    if data is None:
        return Corpus(shape.vocab, shape.seq_len, seed)
    return FileCorpus(data, shape.seq_len, seed)


def sample_index(
    iteration: int, replica: int, microbatch: int, dp: int, microbatches: int, microbatch_size: int
) -> int:
    """First global sample of a microbatch: iterations take consecutive global batches;
    inside one, replica r's microbatch j takes slot r * m + j."""
    per_iteration = dp * microbatches * microbatch_size
    return iteration * per_iteration + (replica * microbatches + microbatch) * microbatch_size


def entropy_floor(vocab: int, noise: float = 0.1) -> float:
    """The loss a perfect model of the corpus reaches (nats per token)."""
    p_main = 1 - noise + noise / vocab
    p_other = noise / vocab
    return -(p_main * math.log(p_main) + (vocab - 1) * p_other * math.log(p_other))
