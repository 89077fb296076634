from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from testbed.errors import InputError
from testbed.job.load import dump_job, load_job, parse_job
from testbed.job.model import MODEL_PRESETS
from testbed.plan.compute import stage_params


def test_defaults_and_presets() -> None:
    job = parse_job({"model": "gpt2"})
    assert job.model == MODEL_PRESETS["gpt2"]
    assert job.microbatches_for(dp=4) == 8
    assert job.activation_bytes == 1 * 1024 * 768 * 2


def test_global_batch_resolves_microbatches() -> None:
    job = parse_job({"model": "tiny", "global_batch": 64, "microbatch_size": 2})
    assert job.microbatches_for(dp=4) == 8
    with pytest.raises(InputError, match="not a multiple"):
        job.microbatches_for(dp=3)
    conflicting = parse_job({"model": "tiny", "global_batch": 64, "microbatches": 4})
    with pytest.raises(InputError, match="global_batch 64 != dp 2"):
        conflicting.microbatches_for(dp=2)


def test_an_overridden_microbatch_count_replaces_the_global_batch() -> None:
    section = {"model": "tiny", "global_batch": 48}
    assert load_job(section, "t.yaml", overrides=["microbatches=4"]).microbatches_for(4) == 4
    kept = load_job(section, "t.yaml", overrides=["dp=4"])
    assert kept.global_batch == 48 and kept.microbatches_for(4) == 12
    both = load_job(section, "t.yaml", overrides=["microbatches=4", "global_batch=48"])
    with pytest.raises(InputError, match="global_batch 48 != dp 4"):
        both.microbatches_for(4)


def test_overrides_and_their_errors() -> None:
    job = load_job(
        {"model": "tiny", "microbatches": 4},
        "t.yaml",
        overrides=["microbatches=6", "model.layers=8", "seed=3"],
    )
    assert job.microbatches == 6
    assert job.model.layers == 8
    assert job.model.hidden == MODEL_PRESETS["tiny"].hidden
    assert job.seed == 3
    with pytest.raises(InputError, match=r"^--set: microbatches: expected a whole number"):
        load_job({"model": "tiny"}, "t.yaml", overrides=["microbatches=many"])
    with pytest.raises(InputError, match=r"^t.yaml: job.microbatches: must be positive"):
        load_job({"model": "tiny", "microbatches": 0}, "t.yaml")
    with pytest.raises(InputError, match="expected KEY=VALUE"):
        load_job({}, "t.yaml", overrides=["microbatches"])


def test_job_file_replaces_topology_job(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("model: small\nmicrobatches: 3\n")
    job = load_job({"model": "tiny"}, "t.yaml", job_file=path)
    assert job.model == MODEL_PRESETS["small"]
    assert job.microbatches == 3
    path.write_text("model: small\nmicrobatchez: 3\n")
    with pytest.raises(InputError, match=r"job.yaml: microbatchez: unknown key"):
        load_job(None, None, job_file=path)


def test_inference_workload(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrival_s,prompt_len\n0.5,100\n0.1,200\n")
    source = str(tmp_path / "topo.yaml")
    job = load_job(
        {
            "model": "tiny",
            "inference": {"model": "tiny", "trace": "trace.csv", "decode_dc": "east"},
        },
        source,
    )
    assert job.inference is not None
    assert job.inference.trace == ((0.1, 200), (0.5, 100))
    job = parse_job(
        {
            "model": "tiny",
            "inference": {
                "arrival_rate": "20/s",
                "prompt_length": {"distribution": "uniform", "min": 64, "max": 256},
            },
        }
    )
    assert job.inference is not None and job.inference.arrival_rate == 20.0
    assert job.inference.prompt.mean == 160
    with pytest.raises(InputError, match="give a positive arrival_rate or a trace"):
        parse_job({"model": "tiny", "inference": {"model": "tiny"}})
    with pytest.raises(InputError, match="max 10 is below min 64"):
        parse_job(
            {
                "model": "tiny",
                "inference": {
                    "arrival_rate": 1,
                    "prompt_length": {"distribution": "uniform", "min": 64, "max": 10},
                },
            }
        )


def test_model_shape_checks() -> None:
    with pytest.raises(InputError, match="heads do not divide hidden"):
        parse_job({"model": {"layers": 2, "hidden": 10, "heads": 3, "seq_len": 8, "vocab": 8}})
    with pytest.raises(InputError, match="unknown model preset"):
        parse_job({"model": "gpt9"})
    with pytest.raises(InputError, match="a stage needs a layer"):
        parse_job({"model": "tiny", "pp": 5})


# Published parameter counts of the released models, and the parameters they have that
# the formula leaves out (norms, biases, learned positions), from their architectures
PUBLISHED = {
    # Hugging Face `gpt2` (Radford et al. 2019 call it 117M): learned positions, and per
    # layer two LayerNorms (2h each) and the biases of QKV (3h), projection (h), MLP up
    # (4h) and down (h), plus the final LayerNorm (2h)
    "gpt2": (124_439_808, lambda m: m.seq_len * m.hidden + 13 * m.hidden * m.layers
             + 2 * m.hidden),
    "gpt2-xl": (1_557_611_200, lambda m: m.seq_len * m.hidden + 13 * m.hidden * m.layers
                + 2 * m.hidden),  # Hugging Face `gpt2-xl` (the paper's 1542M)
    # Hugging Face `meta-llama/Llama-2-7b-hf` and `-70b-hf`: RMSNorm weights only, two per
    # layer and the final one; no biases, rotary positions
    "llama2-7b": (6_738_415_616, lambda m: (2 * m.layers + 1) * m.hidden),
    "llama2-70b": (68_976_648_192, lambda m: (2 * m.layers + 1) * m.hidden),
}


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_presets_count_their_published_parameters(name: str) -> None:
    shape = MODEL_PRESETS[name]
    published, not_matrices = PUBLISHED[name]
    assert shape.params == published - not_matrices(shape)
    assert shape.params == pytest.approx(published, rel=0.02)


def test_gpt3_counts_175b() -> None:
    # Brown et al. 2020, Table 2.1: 175.0B parameters
    assert MODEL_PRESETS["gpt3-175b"].params == pytest.approx(175.0e9, rel=0.01)


def test_the_mlp_kind_and_tied_embeddings_shape_the_count() -> None:
    llama, gpt2 = MODEL_PRESETS["llama2-7b"], MODEL_PRESETS["gpt2"]
    h, f = llama.hidden, llama.ffn_hidden
    assert llama.params_per_layer == 4 * h * h + 3 * h * f  # gate, up and down
    assert dataclasses.replace(llama, mlp="gelu").params_per_layer == 4 * h * h + 2 * h * f
    layers = gpt2.layers * gpt2.params_per_layer
    assert gpt2.params == layers + gpt2.vocab * gpt2.hidden  # tied: counted once
    untied = dataclasses.replace(gpt2, tied_embeddings=False)
    assert untied.params == layers + 2 * gpt2.vocab * gpt2.hidden
    # one stage holds a tied matrix once; each end of a pipeline holds it
    assert stage_params(gpt2, gpt2.layers, True, True) == gpt2.params
    assert stage_params(untied, untied.layers, True, True) == untied.params
    ends = stage_params(gpt2, 6, True, False) + stage_params(gpt2, 6, False, True)
    assert ends == gpt2.params + gpt2.vocab * gpt2.hidden


def test_tiny_and_small_are_costed_as_they_always_were() -> None:
    for name in ("tiny", "small"):
        m = MODEL_PRESETS[name]
        assert (m.mlp, m.tied_embeddings) == ("gelu", False)
        per_layer = 12 * m.hidden * m.hidden
        assert stage_params(m, m.layers, True, True) == m.layers * per_layer \
            + 2 * m.vocab * m.hidden


def test_mlp_and_tied_embeddings_in_a_model_mapping() -> None:
    base = {"layers": 2, "hidden": 16, "heads": 2, "seq_len": 8, "vocab": 32}
    job = parse_job({"model": {**base, "mlp": "swiglu", "tied_embeddings": True}})
    assert (job.model.mlp, job.model.tied_embeddings) == ("swiglu", True)
    plain = parse_job({"model": base}).model
    assert (plain.mlp, plain.tied_embeddings) == ("gelu", False)
    from_preset = parse_job({"model": {"preset": "llama2-7b", "layers": 4}}).model
    assert (from_preset.mlp, from_preset.tied_embeddings, from_preset.layers) == \
        ("swiglu", False, 4)
    assert load_job({"model": "gpt2"}, "t.yaml", overrides=["model.mlp=swiglu"]).model == \
        dataclasses.replace(MODEL_PRESETS["gpt2"], mlp="swiglu")
    assert parse_job(dump_job(job), prefix="") == job
    with pytest.raises(InputError, match=r"^t.yaml: job.model.mlp: unknown MLP 'relu' "
                       r"\(one of gelu, swiglu\)$"):
        load_job({"model": {**base, "mlp": "relu"}}, "t.yaml")
    with pytest.raises(InputError, match=r"^--set: model.tied_embeddings: expected true or "
                       r"false, got 'no way'$"):
        load_job({"model": "tiny"}, "t.yaml", overrides=["model.tied_embeddings=no way"])
    with pytest.raises(InputError, match=r"^t.yaml: job.model.preset: unknown model preset "
                       r"'gpt9'"):
        load_job({"model": {"preset": "gpt9"}}, "t.yaml")


def test_the_optimizer_is_adamw_with_diloco_s_weight_decay_unless_the_job_says() -> None:
    default = parse_job({"model": "tiny"}).optimizer
    assert (default.lr, default.weight_decay) == (3e-3, 0.1)
    given = load_job({"model": "tiny", "optimizer": {"lr": 4e-4}}, "t.yaml",
                     overrides=["optimizer.weight_decay=0"])
    assert (given.optimizer.lr, given.optimizer.weight_decay) == (4e-4, 0.0)
    assert parse_job(dump_job(given), prefix="") == given
    spelled = load_job({"model": "tiny"}, "t.yaml", overrides=["optimizer.lr=4e-4"])
    assert spelled.optimizer.lr == 4e-4  # YAML reads 4e-4 as text
    for section, overrides, message in [
        ({"lr": 0}, [], r"^t.yaml: job.optimizer.lr: must be positive, got 0$"),
        ({}, ["optimizer.lr=fast"], r"^--set: optimizer.lr: expected a number, got 'fast'$"),
        ({"weight_decay": -0.1}, [],
         r"^t.yaml: job.optimizer.weight_decay: must be zero or more, got -0.1$"),
        ({"lr": float("inf")}, [], r"^t.yaml: job.optimizer.lr: expected a finite number"),
        ({"betas": [0.9, 0.95]}, [], r"^t.yaml: job.optimizer.betas: unknown key"),
    ]:
        with pytest.raises(InputError, match=message):
            load_job({"model": "tiny", "optimizer": section}, "t.yaml", overrides=overrides)
