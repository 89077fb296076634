"""The torch model: stages compose to the whole model; the corpus is learnable and seeded."""

from __future__ import annotations

import torch

from testbed.job import MODEL_PRESETS, ModelShape
from testbed.runtime.model import Corpus, build_model, build_stages, sample_index


def test_stages_compose_to_the_whole_model() -> None:
    shape = MODEL_PRESETS["tiny"]
    whole = build_model(shape, seed=3)
    stages = build_stages(shape, (1, 2, 1), seed=3)
    tokens = torch.randint(shape.vocab, (2, shape.seq_len))
    x = tokens
    for stage in stages:
        x = stage(x)
    assert torch.allclose(x, whole(tokens), atol=1e-5)


def test_grouped_query_attention_runs() -> None:
    shape = ModelShape(layers=2, hidden=32, heads=4, seq_len=8, vocab=16, kv_heads=2)
    out = build_model(shape, seed=0)(torch.randint(16, (1, 8)))
    assert out.shape == (1, 8, 16)


def test_corpus_is_deterministic_and_structured() -> None:
    corpus = Corpus(64, 32, seed=1)
    assert torch.equal(corpus.sample(5), Corpus(64, 32, seed=1).sample(5))
    assert not torch.equal(corpus.sample(5), corpus.sample(6))
    seq = corpus.sample(7)
    follows = sum(int(corpus.successor[seq[i]] == seq[i + 1]) for i in range(32))
    assert follows >= 24  # mostly the fixed successor


def test_sample_indices_partition_the_global_batch() -> None:
    seen = [
        sample_index(it, r, j, 2, 3, 4) + e
        for it in range(2)
        for r in range(2)
        for j in range(3)
        for e in range(4)
    ]
    assert sorted(seen) == list(range(48))
