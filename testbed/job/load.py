"""Reading and writing a job: the topology's `job` section or a job file, `--set`
overrides, model presets, the inference workload and its trace files."""

from __future__ import annotations

import copy
import csv
import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NotRequired, Required, TypedDict

from testbed.common.codec import JsonObject
from testbed.common.fields import (
    Fields,
    at_most,
    boolean,
    bounded,
    integer,
    number,
    positive,
    text,
)
from testbed.common.input_files import MAX_CSV_BYTES, read_input
from testbed.common.sizes import (
    MAX_ARRIVAL_RATE,
    MAX_GLOBAL_BATCH,
    MAX_ITERATIONS,
    MAX_MICROBATCHES,
    MAX_SEED,
)
from testbed.common.units import parse_duration, parse_per_second, plural
from testbed.common.yamlio import parse_yaml, read_yaml
from testbed.errors import InputError
from testbed.job.compute_time import (
    COMPUTE_TIME_KEYS,
    ComputeTimeSection,
    dump_compute_time,
    parse_compute_time,
)
from testbed.job.data import DataSection, dump_data, parse_data
from testbed.job.model import (
    DTYPE_BYTES,
    MLP_MATRICES,
    MODEL_PRESETS,
    InferenceWorkload,
    InnerOptimizer,
    Job,
    MlpKind,
    ModelShape,
    PromptLengths,
)
from testbed.job.optimizer import (
    OPTIMIZER_KEYS,
    OptimizerSection,
    dump_optimizer,
    parse_optimizer,
)


def load_job(
    topology_job: Mapping[str, Any] | None,
    topology_source: str | None,
    job_file: str | Path | None = None,
    overrides: Sequence[str] = (),
    flags: Sequence[str] = (),
) -> Job:
    """The topology's `job` section, replaced by a job file, then single values overridden:
    `overrides` as `--set` gives them, then `flags` (`key=value` of a key that has its
    own flag, `--microbatches`); an error in an overridden value names what gave it."""
    source: str | None
    if job_file is not None:
        raw = read_yaml(job_file)
        source = str(job_file)
        if isinstance(raw, dict) and "job" in raw and len(raw) == 1:
            raw = raw["job"]
            prefix = "job"
        else:
            prefix = ""
    else:
        raw = copy.deepcopy(dict(topology_job)) if topology_job is not None else {}
        source = topology_source
        prefix = "job"
    if not isinstance(raw, dict):
        raise InputError("expected a mapping of job settings", source)
    overridden = apply_overrides(raw, [*overrides, *flags])
    flagged = {item.partition("=")[0].strip() for item in flags}
    base = Path.cwd() if {"data", "data.path"} & set(overridden) else None
    try:
        return parse_job(raw, source, prefix, base)
    except InputError as exc:
        key = (exc.key or "").removeprefix(prefix).lstrip(".")
        for given in reversed(overridden):  # the last one given is in force
            if given in flagged and key == given:
                raise InputError(exc.problem, f"--{given.replace('_', '-')}") from None
            if key == given or key.startswith((given + ".", given + "[")) \
                    or given.startswith(key + "."):  # under a section the job lacks: `wan.x`
                topology_key = _topology_key(given)
                raise InputError(topology_key or exc.problem, "--set",
                                 given if topology_key else key) from None
        raise


def _topology_key(key: str) -> str | None:
    """Why `--set KEY` is refused when KEY is in a section of the topology that cannot be
    set from the command line."""
    from testbed.topology.load import TOPOLOGY_KEYS
    from testbed.topology.overrides import EXAMPLES

    section = key.split(".")[0]
    if section not in TOPOLOGY_KEYS:
        return None
    return (f"{section!r} is the topology's and cannot be set here: edit the topology file "
            f"(--set and sweep --vary take job keys and {EXAMPLES})")


def apply_overrides(raw: JsonObject, overrides: Sequence[str]) -> list[str]:
    """Apply `key.path=value` strings (values read as YAML scalars) in place, to a job
    file's raw data (as read, or dump_job's through codec.raw) before it is parsed."""
    keys = []
    for item in overrides:
        key, sep, value_text = item.partition("=")
        key = key.strip().removeprefix("job.")  # `job.microbatches`, as the file nests it
        if not sep or not key:
            raise InputError(f"expected KEY=VALUE, got {item!r}", "--set")
        value = parse_yaml(value_text, "--set") if value_text.strip() else None
        parts = key.split(".")
        node = raw
        for part in parts[:-1]:
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif isinstance(child, str) and part == "model" and child in MODEL_PRESETS:
                child = node[part] = _dump_model(MODEL_PRESETS[child])
            if not isinstance(child, dict):
                raise InputError(f"{part!r} is not a section", "--set", key)
            node = child
        node[parts[-1]] = value
        keys.append(key)
    if "global_batch" not in keys and any(k in _BATCH_SHAPE for k in keys):
        raw.pop("global_batch", None)  # the batch follows the microbatches given
    return keys


_BATCH_SHAPE = ("microbatches",)


def parse_job(data: object, source: str | None = None, prefix: str = "job",
              base: Path | None = None) -> Job:
    """`base`: where relative paths start (default: the folder of `source`)."""
    fields = Fields(data, source, prefix, ("model", "microbatch_size", "microbatches",
                                           "global_batch", "dp", "pp", "tp", "iterations",
                                           "seed", "dtype", "inference", "data",
                                           "optimizer", "token_budget", "compute_time"))
    base = base if base is not None else source_folder(source)
    model = _parse_model(fields, "model")
    microbatch_size = fields.get("microbatch_size", positive(integer), 1)
    microbatches = fields.get("microbatches", at_most(positive(integer), MAX_MICROBATCHES), None)
    global_batch = fields.get("global_batch", at_most(positive(integer), MAX_GLOBAL_BATCH), None)
    dp = fields.get("dp", positive(integer), None)
    pp = fields.get("pp", positive(integer), None)
    tp = fields.get("tp", positive(integer), 1)
    iterations = fields.get("iterations", at_most(positive(integer), MAX_ITERATIONS), 5)
    seed = fields.get("seed", at_most(positive(integer, allow_zero=True), MAX_SEED), 0)
    dtype = fields.get("dtype", text, "bf16")
    if dtype not in DTYPE_BYTES:
        raise fields.error("dtype", f"unknown dtype {dtype!r} (one of {', '.join(DTYPE_BYTES)})")
    if pp is not None and pp > model.layers:
        raise fields.error("pp", f"{plural(pp, 'stage')} for {plural(model.layers, 'layer')}: "
                           "a stage needs a layer")
    if model.hidden % tp or model.heads % tp:
        raise fields.error(
            "tp", f"tp {tp} must divide hidden {model.hidden} and heads {model.heads}"
        )
    inference = _parse_inference(fields.section("inference", keys=(
        "model", "arrival_rate", "prompt_length", "trace", "trace_rows", "decode_dc",
        "deadline", "max_batch_tokens")), source)
    corpus = parse_data(fields, "data", model, base)
    optimizer = parse_optimizer(fields.section("optimizer", keys=OPTIMIZER_KEYS))
    token_budget = fields.get("token_budget", positive(integer), None)
    compute_time = parse_compute_time(fields.section("compute_time", keys=COMPUTE_TIME_KEYS))
    fields.done()
    return Job(
        model,
        microbatch_size,
        microbatches,
        global_batch,
        dp,
        pp,
        tp,
        iterations,
        seed,
        dtype,
        inference,
        source,
        corpus,
        optimizer,
        token_budget,
        compute_time,
    )


def source_folder(source: str | None) -> Path:
    """The folder of the file a value came from, or the working directory for `--set`."""
    return Path(source).parent if source and source != "--set" else Path(".")


def _parse_model(fields: Fields, name: str) -> ModelShape:
    value = fields.raw(name, "tiny")
    if isinstance(value, str):
        return fields.get(name, _preset, MODEL_PRESETS["tiny"])
    spec = Fields(value, fields.source, fields.key(name),
                  ("preset", "layers", "hidden", "heads", "seq_len", "vocab", "kv_heads", "ffn",
                   "mlp", "tied_embeddings"))
    base = spec.get("preset", _preset, None)

    def pick(key: str, default: int | None) -> Any:
        return spec.get(key, positive(integer), default)

    def required(key: str) -> Any:
        """From the preset, or else the mapping must say it."""
        if base is not None:
            return pick(key, getattr(base, key))
        return spec.get(key, positive(integer))

    shape = ModelShape(
        layers=required("layers"),
        hidden=required("hidden"),
        heads=required("heads"),
        seq_len=required("seq_len"),
        vocab=required("vocab"),
        kv_heads=pick("kv_heads", base.kv_heads if base else None),
        ffn=pick("ffn", base.ffn if base else None),
        mlp=spec.get("mlp", _mlp_kind, base.mlp if base else "gelu"),
        tied_embeddings=spec.get("tied_embeddings", boolean,
                                 base.tied_embeddings if base else False),
    )
    if shape.hidden % shape.heads:
        raise spec.error("heads", f"{shape.heads} heads do not divide hidden {shape.hidden}")
    if shape.heads % shape.n_kv_heads:
        raise spec.error(
            "kv_heads", f"{shape.n_kv_heads} KV heads do not divide {shape.heads} heads"
        )
    spec.done()
    return shape


def _preset(value: Any) -> ModelShape:
    name = text(value)
    if name not in MODEL_PRESETS:
        raise ValueError(
            f"unknown model preset {name!r} (one of {', '.join(MODEL_PRESETS)}, or a mapping)")
    return MODEL_PRESETS[name]


def _mlp_kind(value: Any) -> MlpKind:
    for kind in MLP_MATRICES:
        if value == kind:
            return kind
    raise ValueError(f"unknown MLP {value!r} (one of {', '.join(MLP_MATRICES)})")


class ModelSection(TypedDict):
    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    mlp: str
    tied_embeddings: bool
    kv_heads: NotRequired[int]
    ffn: NotRequired[int]


def _dump_model(shape: ModelShape) -> ModelSection:
    out: ModelSection = {
        "layers": shape.layers,
        "hidden": shape.hidden,
        "heads": shape.heads,
        "seq_len": shape.seq_len,
        "vocab": shape.vocab,
        "mlp": shape.mlp,
        "tied_embeddings": shape.tied_embeddings,
    }
    if shape.kv_heads is not None:
        out["kv_heads"] = shape.kv_heads
    if shape.ffn is not None:
        out["ffn"] = shape.ffn
    return out


def _parse_inference(fields: Fields | None, source: str | None) -> InferenceWorkload | None:
    if fields is None:
        return None
    model = _parse_model(fields, "model")
    rate = fields.get("arrival_rate", bounded(parse_per_second, 0.0, MAX_ARRIVAL_RATE,
                                              lambda r: f"{r:,g}/s"), 0.0)
    prompt = _parse_prompt(fields.section("prompt_length", keys=(
        "distribution", "value", "min", "max", "median", "sigma")))
    trace = None
    if fields.has("trace_rows"):
        trace = _trace_rows(fields)
    elif fields.has("trace"):
        trace_path = fields.get("trace", text)
        trace = _read_trace(source_folder(source) / trace_path, fields.key("trace"))
    elif rate <= 0:
        raise fields.error("arrival_rate", "give a positive arrival_rate or a trace file")
    decode_dc = fields.get("decode_dc", text, None)
    deadline = fields.get("deadline", positive(parse_duration), 5.0)
    batch_tokens = fields.get("max_batch_tokens", positive(integer), 8192)
    fields.done()
    return InferenceWorkload(model, rate, prompt, trace, decode_dc, deadline, batch_tokens)


def _trace_rows(fields: Fields) -> tuple[tuple[float, int], ...]:
    rows = []
    for key, row in fields.items("trace_rows"):
        if not (isinstance(row, list) and len(row) == 2):
            raise InputError("expected [arrival_s, prompt_len]", fields.source, key)
        try:
            arrival, length = number(row[0]), integer(row[1])
        except ValueError as exc:
            raise InputError(str(exc), fields.source, key) from None
        if arrival < 0 or length <= 0:
            raise InputError("arrival must be >= 0 and prompt_len > 0", fields.source, key)
        rows.append((arrival, length))
    if not rows:
        raise fields.error("trace_rows", "holds no requests")
    return tuple(sorted(rows))


def _parse_prompt(fields: Fields | None) -> PromptLengths:
    if fields is None:
        return PromptLengths("fixed", 128, 128)
    kind = fields.get("distribution", text, "fixed")
    if kind == "fixed":
        value = fields.get("value", positive(integer))
        result = PromptLengths("fixed", value, value)
    elif kind == "uniform":
        low = fields.get("min", positive(integer))
        high = fields.get("max", positive(integer))
        if high < low:
            raise fields.error("max", f"max {high} is below min {low}")
        result = PromptLengths("uniform", low, high)
    elif kind == "lognormal":
        median = fields.get("median", positive(number))
        sigma = fields.get("sigma", positive(number, allow_zero=True))
        high = fields.get("max", positive(integer), int(median * 16))
        result = PromptLengths("lognormal", 1, high, median, sigma)
    else:
        raise fields.error(
            "distribution", f"unknown distribution {kind!r} (fixed, uniform or lognormal)"
        )
    fields.done()
    return result


def _read_trace(path: Path, key: str) -> tuple[tuple[float, int], ...]:
    """CSV rows of `arrival_s,prompt_len`; a header row is allowed."""
    try:
        rows = list(csv.reader(io.StringIO(read_input(path, MAX_CSV_BYTES), newline="")))
    except csv.Error as exc:
        raise InputError(f"not CSV: {exc}", str(path)) from None
    out: list[tuple[float, int]] = []
    for line, row in enumerate(rows, start=1):
        if not row or (line == 1 and not _is_number(row[0])):
            continue
        try:
            arrival, length = float(row[0]), int(row[1])
        except (ValueError, IndexError):
            raise InputError("expected arrival_s,prompt_len", str(path), f"line {line}") from None
        if arrival < 0 or length <= 0 or not math.isfinite(arrival):
            raise InputError("arrival must be >= 0 and prompt_len > 0", str(path), f"line {line}")
        out.append((arrival, length))
    if not out:
        raise InputError("trace holds no requests", str(path), key)
    return tuple(sorted(out))


def _is_number(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


class PromptLengthSection(TypedDict, total=False):
    distribution: Required[str]
    value: int
    min: int
    max: int
    median: float
    sigma: float


class InferenceSection(TypedDict):
    model: ModelSection
    deadline: float
    max_batch_tokens: int
    trace_rows: NotRequired[list[list[float]]]
    arrival_rate: NotRequired[float]
    prompt_length: PromptLengthSection
    decode_dc: NotRequired[str]


class JobDocument(TypedDict):
    """A job file as dump_job writes it."""

    model: ModelSection
    microbatch_size: int
    iterations: int
    seed: int
    dtype: str
    tp: int
    microbatches: NotRequired[int]
    global_batch: NotRequired[int]
    dp: NotRequired[int]
    pp: NotRequired[int]
    token_budget: NotRequired[int]
    data: NotRequired[DataSection]
    optimizer: NotRequired[OptimizerSection]
    compute_time: NotRequired[ComputeTimeSection]
    inference: NotRequired[InferenceSection]


def dump_job(job: Job) -> JobDocument:
    """Plain data that `parse_job(data, prefix="")` reads back to an equal Job (a trace
    workload is written inline as `trace_rows`)."""
    out: JobDocument = {"model": _dump_model(job.model),
                        "microbatch_size": job.microbatch_size,
                        "iterations": job.iterations, "seed": job.seed, "dtype": job.dtype,
                        "tp": job.tp}
    if job.microbatches is not None:
        out["microbatches"] = job.microbatches
    if job.global_batch is not None:
        out["global_batch"] = job.global_batch
    if job.dp is not None:
        out["dp"] = job.dp
    if job.pp is not None:
        out["pp"] = job.pp
    if job.token_budget is not None:
        out["token_budget"] = job.token_budget
    if job.data is not None:
        out["data"] = dump_data(job.data)
    if job.optimizer != InnerOptimizer():
        out["optimizer"] = dump_optimizer(job.optimizer)
    if job.compute_time is not None:
        out["compute_time"] = dump_compute_time(job.compute_time)
    if job.inference is not None:
        out["inference"] = _dump_inference(job.inference)
    return out


def _dump_inference(inf: InferenceWorkload) -> InferenceSection:
    prompt = inf.prompt
    length: PromptLengthSection
    if prompt.distribution == "fixed":
        length = {"distribution": "fixed", "value": prompt.low}
    elif prompt.distribution == "uniform":
        length = {"distribution": "uniform", "min": prompt.low, "max": prompt.high}
    else:
        length = {"distribution": "lognormal", "median": prompt.median,
                  "sigma": prompt.sigma, "max": prompt.high}
    workload: InferenceSection = {
        "model": _dump_model(inf.model), "deadline": inf.deadline_s,
        "max_batch_tokens": inf.max_batch_tokens,
        "trace_rows": [list(row) for row in inf.trace or ()],
        "arrival_rate": inf.arrival_rate, "prompt_length": length,
        "decode_dc": inf.decode_dc or ""}
    if inf.trace is not None:  # a trace written inline, or a rate: one of the two
        del workload["arrival_rate"]
    else:
        del workload["trace_rows"]
    if inf.decode_dc is None:
        del workload["decode_dc"]
    return workload
