"""The training job (model shape, batch, parallelism) and an optional inference workload;
their files are read in testbed.job.load."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from testbed.errors import InputError

MlpKind = Literal["gelu", "swiglu"]
MLP_MATRICES: Mapping[MlpKind, int] = {"gelu": 2, "swiglu": 3}
"""Weight matrices of a layer's MLP: up and down (GPT's GELU MLP), or gate, up and down
(Llama's SwiGLU)."""


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer, enough to count FLOPs, bytes and build it in torch."""

    layers: int
    """Transformer layers: what pipeline stages split (`split_layers`)."""
    hidden: int
    """Model width: an activation crossing a stage boundary is seq_len x hidden per sequence."""
    heads: int
    """Attention heads."""
    seq_len: int
    """Tokens per sequence."""
    vocab: int
    """Vocabulary size: the embedding and output layers' rows."""
    kv_heads: int | None = None
    """Key and value heads under grouped-query attention; None: as many as `heads`."""
    ffn: int | None = None
    """The MLP's hidden width; None: 4 x hidden."""
    mlp: MlpKind = "gelu"
    """gelu (GPT's two matrices) or swiglu (Llama's three)."""
    tied_embeddings: bool = False
    """The output layer reuses the token embedding's matrix (GPT-2, GPT-3) instead of
    having its own (Llama 2). Under pipeline parallelism the first and the last stage
    each hold it, as Megatron does; a model in one piece holds it once."""

    @property
    def head_dim(self) -> int:
        """Width of one attention head: hidden / heads."""
        return self.hidden // self.heads

    @property
    def ffn_hidden(self) -> int:
        """The MLP's hidden width: `ffn`, else 4 x hidden."""
        return self.ffn if self.ffn is not None else 4 * self.hidden

    @property
    def n_kv_heads(self) -> int:
        """Key and value heads: `kv_heads`, else `heads`."""
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def params_per_layer(self) -> int:
        """A layer's weight matrices: query and output projections, keys and values (fewer
        heads under grouped-query attention), and the MLP's. Norms and biases, a few
        thousandths of a layer, are left out."""
        kv = 2 * self.hidden * self.n_kv_heads * self.head_dim
        mlp = MLP_MATRICES[self.mlp] * self.hidden * self.ffn_hidden
        return 2 * self.hidden * self.hidden + kv + mlp

    @property
    def embedding_params(self) -> int:
        """The token embedding; an untied output layer has as many again."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """The whole model's weight matrices, a tied embedding counted once."""
        heads = 1 if self.tied_embeddings else 2
        return self.layers * self.params_per_layer + heads * self.embedding_params


MODEL_PRESETS: Mapping[str, ModelShape] = {
    # Ours, small enough to train on a CPU: GELU and untied, the shape they have always
    # been costed and trained as (their results do not move)
    "tiny": ModelShape(layers=4, hidden=64, heads=4, seq_len=32, vocab=256),
    "small": ModelShape(layers=6, hidden=256, heads=8, seq_len=128, vocab=1024),
    # GPT-2 (Radford et al. 2019; Hugging Face `gpt2`, `gpt2-xl` config.json: n_layer,
    # n_embd, n_head, n_ctx, vocab_size 50257, tied output layer): 124M and 1,558M
    "gpt2": ModelShape(layers=12, hidden=768, heads=12, seq_len=1024, vocab=50257,
                       tied_embeddings=True),
    "gpt2-xl": ModelShape(layers=48, hidden=1600, heads=25, seq_len=1024, vocab=50257,
                          tied_embeddings=True),
    # GPT-3 175B (Brown et al. 2020, Table 2.1: 96 layers, d_model 12288, 96 heads,
    # context 2048; GPT-2's tokenizer and tied embeddings): 175.0B
    "gpt3-175b": ModelShape(layers=96, hidden=12288, heads=96, seq_len=2048, vocab=50257,
                            tied_embeddings=True),
    # Llama 2 (Touvron et al. 2023; Hugging Face `meta-llama/Llama-2-7b-hf`, `-70b-hf`
    # config.json: intermediate_size, num_key_value_heads, vocab_size 32000,
    # tie_word_embeddings false; SwiGLU MLP): 6,738M and 68,977M
    "llama2-7b": ModelShape(layers=32, hidden=4096, heads=32, seq_len=4096, vocab=32000,
                            ffn=11008, mlp="swiglu"),
    "llama2-70b": ModelShape(layers=80, hidden=8192, heads=64, seq_len=4096, vocab=32000,
                             kv_heads=8, ffn=28672, mlp="swiglu"),
}

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}

DataFormat = Literal["text", "uint16"]
DATA_FORMATS: Mapping[str, DataFormat] = {".txt": "text", ".bin": "uint16"}
"""A data file's format when only its path is given, by extension."""


@dataclass(frozen=True)
class DataFile:
    """A corpus on disk for real compute to train on instead of the synthetic one: text
    read byte by byte (each byte a token: 256 of them), or little-endian uint16 token ids
    (as nanoGPT's prepare scripts write `train.bin`)."""

    path: str
    """Absolute: every worker opens it by this path (on every machine of a cluster)."""
    format: DataFormat
    tokens: int


@dataclass(frozen=True)
class PromptLengths:
    """How long prompts are: fixed, uniform in [low, high], or lognormal around a median."""

    distribution: str
    low: int = 0
    high: int = 0
    median: float = 0.0
    sigma: float = 0.0

    @property
    def mean(self) -> float:
        if self.distribution == "fixed":
            return float(self.low)
        if self.distribution == "uniform":
            return (self.low + self.high) / 2
        return self.median * math.exp(self.sigma**2 / 2)


@dataclass(frozen=True)
class InferenceWorkload:
    """Prefill requests to serve inside training bubbles."""

    model: ModelShape
    arrival_rate: float = 0.0
    """Requests per second (Poisson); ignored when a trace is given."""
    prompt: PromptLengths = PromptLengths("fixed", 128, 128)
    trace: tuple[tuple[float, int], ...] | None = None
    """(arrival time in seconds, prompt length) pairs from a trace file."""
    decode_dc: str | None = None
    deadline_s: float = 5.0
    """A request not started this long after arrival is rejected."""
    max_batch_tokens: int = 8192
    """Most prompt tokens one prefill pass takes (several prompts batched, or a chunk of a
    longer one): a serving engine's token budget per step. Each GPU that fills bubbles
    keeps room for this many tokens' KV cache beside the longest prompt's."""


@dataclass(frozen=True)
class InnerOptimizer:
    """The optimizer real compute trains with, every policy alike (data and pipeline
    parallel steps, and the DiLoCo family's inner steps): torch.optim.AdamW at a constant
    learning rate, betas (0.9, 0.999), eps 1e-8 (torch's).

    AdamW with weight decay 0.1 is DiLoCo's inner optimizer (Douillard et al. 2023, arXiv
    2311.08105; torchft's DiLoCo example steps AdamW too). The paper's learning rate, 4e-4
    after 1,000 warm-up steps, is sized for its 60M to 400M parameter models over 88,000
    steps; the tiny models real compute trains here, over tens of steps, barely learn at
    it, so the default is 3e-3 (`optimizer.lr` sets the paper's)."""

    lr: float = 3e-3
    weight_decay: float = 0.1


@dataclass(frozen=True)
class ComputeTime:
    """A measured compute time the job's compute is costed by (testbed.job.compute_time):
    `seconds` for one replica's whole step, or for one layer's forward and backward of one
    microbatch; the FLOPs of that work over it are the rate every stage computes at."""

    per: Literal["step", "layer"]
    seconds: float


@dataclass(frozen=True)
class Job:
    """The training job a policy plans: the model, the batch, and whatever parallelism the
    job file fixes (None leaves it to the policy)."""

    model: ModelShape
    """The model's shape: layers, width, sequence length."""
    microbatch_size: int = 1
    """Sequences per microbatch."""
    microbatches: int | None = None
    """Microbatches per replica per iteration; None: from `global_batch` once dp is
    known. Read it through `microbatches_for(dp)`."""
    global_batch: int | None = None
    """Sequences per iteration over every replica, when the job fixes the batch rather than
    the microbatches (then dp x microbatch_size must divide it)."""
    dp: int | None = None
    """Data-parallel replicas the job asks for; None: the policy's choice."""
    pp: int | None = None
    """Pipeline stages the job asks for; None: the policy's choice (`default_pp` takes one
    per datacenter)."""
    tp: int = 1
    """GPUs per tensor-parallel group: every stage of every replica runs on tp GPUs of one
    datacenter."""
    iterations: int = 5
    """Training iterations a run runs (the first, warm-up, is left out of its figures)."""
    seed: int = 0
    """Seeds what a run draws at random: initial weights, the data's order, request
    arrivals, jitter."""
    dtype: str = "bf16"
    """Parameters', activations' and gradients' precision: bf16, fp16 or fp32
    (`dtype_bytes`)."""
    inference: InferenceWorkload | None = None
    """Prefill requests to serve in pipeline bubbles (bubble policies), or None."""
    source: str | None = field(default=None, compare=False)
    """The file the job was read from, for errors that name it; None when built in code."""
    data: DataFile | None = None
    """None: the seeded synthetic corpus (testbed.emulator.runtime.worker.compute.model.Corpus)."""
    optimizer: InnerOptimizer = InnerOptimizer()
    """What real compute trains with (emulated compute and the simulator use none)."""
    token_budget: int | None = None
    """Tokens the whole training run is meant to see (a run simulates or emulates a few
    of its iterations): what the loss model's default target is the synchronous loss at;
    None: 20 per parameter, the compute-optimal budget (`tokens_budgeted`)."""
    compute_time: ComputeTime | None = None
    """A measured compute time to cost compute by, instead of the GPUs' peak and
    efficiency; None: their FLOP rate."""

    @property
    def tokens_budgeted(self) -> int:
        """`token_budget`, else 20 tokens per parameter (Hoffmann et al. 2022's
        compute-optimal ratio, as Charles et al. 2025 train to)."""
        return self.token_budget if self.token_budget is not None else 20 * self.model.params

    @property
    def dtype_bytes(self) -> int:
        """Bytes per parameter, activation or gradient value: 2 for bf16 and fp16, 4 for fp32."""
        return DTYPE_BYTES[self.dtype]

    @property
    def tokens_per_microbatch(self) -> int:
        """microbatch_size x seq_len."""
        return self.microbatch_size * self.model.seq_len

    @property
    def activation_bytes(self) -> int:
        """Bytes crossing a stage boundary per microbatch: batch x seq x hidden x dtype."""
        return self.microbatch_size * self.model.seq_len * self.model.hidden * self.dtype_bytes

    def microbatches_for(self, dp: int) -> int:
        """Microbatches per replica per iteration once the number of replicas is known."""
        per_step = dp * self.microbatch_size
        if self.microbatches is not None:
            if self.global_batch is not None and self.global_batch != per_step * self.microbatches:
                raise InputError(
                    f"global_batch {self.global_batch} != dp {dp} x microbatch_size "
                    f"{self.microbatch_size} x microbatches {self.microbatches}",
                    self.source,
                    "job.global_batch",
                )
            return self.microbatches
        if self.global_batch is not None:
            if self.global_batch % per_step:
                raise InputError(
                    f"global_batch {self.global_batch} is not a multiple of dp {dp} x "
                    f"microbatch_size {self.microbatch_size}",
                    self.source,
                    "job.global_batch",
                )
            return self.global_batch // per_step
        return 8
