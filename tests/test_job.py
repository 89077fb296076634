from __future__ import annotations

from pathlib import Path

import pytest

from testbed.errors import InputError
from testbed.job import MODEL_PRESETS
from testbed.job_file import load_job, parse_job


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
