"""The torch model: stages compose to the whole model; the corpus is learnable and seeded."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

from testbed.common.choices import ComputeChoice
from testbed.emulator.runtime.coordinator.preflight import check_emulable
from testbed.emulator.runtime.worker.compute.model import (
    Corpus,
    build_model,
    build_stages,
    sample_index,
)
from testbed.errors import InputError
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.job.model import MODEL_PRESETS, ModelShape
from testbed.plan.compute import stage_params
from testbed.plan.model import split_layers
from testbed.policy import training_policy
from testbed.run.spec import RunSpec


def test_stages_compose_to_the_whole_model() -> None:
    shape = MODEL_PRESETS["tiny"]
    whole = build_model(shape, seed=3)
    stages = build_stages(shape, (1, 2, 1), seed=3)
    tokens = torch.randint(shape.vocab, (2, shape.seq_len))
    x = tokens
    for stage in stages:
        x = stage(x)
    assert torch.allclose(x, whole(tokens), atol=1e-5)


def test_swiglu_and_tied_stages_compose_to_the_whole_model() -> None:
    shape = dataclasses.replace(MODEL_PRESETS["tiny"], mlp="swiglu", tied_embeddings=True)
    whole = build_model(shape, seed=3)
    assert whole.head is not None and whole.embed is not None
    assert whole.head[1].weight is whole.embed.weight
    stages = build_stages(shape, (1, 2, 1), seed=3)
    tokens = torch.randint(shape.vocab, (2, shape.seq_len))
    x = tokens
    for stage in stages:
        x = stage(x)
    assert torch.allclose(x, whole(tokens), atol=1e-5)
    gelu = build_model(dataclasses.replace(shape, mlp="gelu"), seed=3)
    assert not torch.allclose(gelu(tokens), x, atol=1e-3)  # the MLP kind is built


def _matrices(module: nn.Module) -> int:
    """Weight matrices and token embedding, each shared one once (the formula's count)."""
    return sum(p.numel() for name, p in module.named_parameters()
               if p.dim() == 2 and not name.startswith("position."))


PRESETS = list(MODEL_PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_each_preset_builds_the_shape_it_is_costed_as(name: str) -> None:
    shape = MODEL_PRESETS[name]
    with torch.device("meta"):  # shapes only: no memory, no initialization
        whole = build_model(shape, seed=0)
    assert _matrices(whole) == shape.params
    everything = sum(p.numel() for p in whole.parameters())
    # norms, biases and learned positions on top: 2.5% of tiny's 64-wide layers
    assert everything == pytest.approx(shape.params, rel=0.03 if name == "tiny" else 0.02)
    assert everything > shape.params


@pytest.mark.parametrize("name", PRESETS)
def test_each_stage_holds_what_it_is_costed_as(name: str) -> None:
    shape = MODEL_PRESETS[name]
    layers = split_layers(shape.layers, 4)
    with torch.device("meta"):
        stages = build_stages(shape, layers, seed=0)
    for index, (stage, count) in enumerate(zip(stages, layers, strict=True)):
        assert _matrices(stage) == stage_params(shape, count, index == 0, index == 3), index


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


ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("sets", "compute", "refused"), [
    (("model.tied_embeddings=true",), "real", True),
    (("model.tied_embeddings=true",), "emulated", False),  # no values to keep in step
    (("model.tied_embeddings=true", "pp=1"), "real", False),  # one stage holds it once
    (("model.mlp=swiglu",), "real", False),
])
def test_real_compute_refuses_a_tied_model_split_over_stages(
        sets: tuple[str, ...], compute: ComputeChoice, refused: bool) -> None:
    inputs = load_inputs(ROOT / "topologies" / "two-dc.yaml", sets=sets)
    plan = plan_with_simulator(training_policy("1f1b"), inputs.topology, inputs.job)
    spec = RunSpec.build("emulate", inputs.topology, inputs.job, policy="1f1b", compute=compute)
    if not refused:
        check_emulable(spec, plan)
        return
    assert plan.pp == 2
    with pytest.raises(InputError) as error:
        check_emulable(spec, plan)
    assert error.value.exit_code == 2 and "\n" not in str(error.value)
    assert str(error.value).startswith(f"{ROOT / 'topologies' / 'two-dc.yaml'}: "
                                       "job.model.tied_embeddings: "
                                       "a tied output layer split over 2 stages")
    assert "--set model.tied_embeddings=false or --compute emulated" in str(error.value)
