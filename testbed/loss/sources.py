"""The published numbers the loss model stands on, each with its source, where in it the
number is, the conditions it was measured under, and how it was read. Nothing here is
fitted by testbed but what `testbed.loss.published` derives from these tables, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Source:
    key: str
    cite: str
    used: str
    """Which numbers are taken from it, and where they are in it."""
    conditions: str
    """Dataset, batch and learning-rate tuning of the runs behind the numbers."""
    read: str
    """How the numbers were read: the paper's text, or what quotes it."""


BESIROGLU = Source(
    "besiroglu2024",
    "Besiroglu, Erdil, Barnett, You: Chinchilla Scaling: A replication attempt "
    "(arXiv 2404.10102, 2024)",
    "L(N, D) = E + A/N^alpha + B/D^beta with E = 1.8172, A = 482.01, B = 2085.43, "
    "alpha = 0.3478, beta = 0.3658: their refit of Hoffmann et al.'s Approach 3 "
    "(standard errors 0.03, 124.58, 1293.23, 0.02, 0.02)",
    "the 245 training runs they reconstructed from Hoffmann et al. 2022's Figure 4 "
    "(MassiveText; Hoffmann's models of 57M-16B parameters, each trained once with a "
    "cosine schedule as long as its run, not tuned per point), 240 kept after dropping the "
    "5 of highest loss, fitted by Huber loss (delta 1e-3) on log loss",
    "the coefficients as quoted identically by several public notes and code that cite the "
    "paper (one gives page 13); the paper's own text could not be opened here. The data "
    "ranges and residuals below are computed from the replication's published data "
    "(github.com/epoch-research/analyzing-chinchilla, data/svg_extracted_data.csv)",
)
"""Chosen over Hoffmann et al.'s own Approach 3 estimates (E 1.69, A 406.4, B 410.7,
alpha 0.34, beta 0.28), which Besiroglu et al. show fit the reconstructed data poorly and
disagree with Hoffmann's Approaches 1 and 2; the refit agrees with them (equal scaling of
N and D)."""

CHARLES = Source(
    "charles2025",
    "Charles, Teston, Dery, Rush, Fallen, Garrett, Szlam, Douillard: Communication-Efficient "
    "Language Model Training Scales Reliably and Robustly: Scaling Laws for DiLoCo "
    "(arXiv 2503.09799v1, 2025)",
    "Table 7: L(N) = A N^alpha for data parallelism and DiLoCo with M = 1, 2, 4, 8 "
    "(H = 30); Table 4: evaluation loss by N (35M-2.4B) and M; Table 5: 4B and 10B runs "
    "with hyperparameters from the fits; Table 11: their fits' held-out residuals",
    "C4 (train split; loss on its validation split), D = 20 N tokens (Chinchilla-optimal), "
    "sequences of 2,048, vocabulary 32,768; AdamW (beta1 0.9, beta2 0.99), 1,000 warm-up "
    "steps then cosine decay to 5%, weight decay 1/T; learning rate swept in powers of "
    "sqrt 2 and global batch in powers of 2 for every N and M (best kept), outer SGD with "
    "Nesterov momentum 0.9 at an outer learning rate swept over 0.2-1.0; bfloat16 weights "
    "and gradients; H = 30",
    "the paper's text (arXiv v1), Tables 4, 5, 7 and 11 and Sections 3-6",
)

DOUILLARD = Source(
    "douillard2025",
    "Douillard, Donchev, Rush, Kale, Charles, Garrett, Teston, Lacey, McIlroy, Shen, Rame, "
    "Szlam, Ranzato, Barham: Streaming DiLoCo with overlapping communication: Towards a "
    "Distributed Free Lunch (arXiv 2501.18512v1, 2025)",
    "Table 5: evaluation loss of data parallelism, DiLoCo (H = 30) and Streaming DiLoCo "
    "with overlapped FP4 communication (H = 30, 100) from 35M to 4B; Table 6: Streaming "
    "DiLoCo at M = 2, 4 and H = 30, 100; Table 7: 1B overtrained on Dolma (25B-250B tokens)",
    "C4 (Tables 5, 6; loss on its validation split) at a Chinchilla-optimal token budget "
    "(Table 2: 700M tokens at 35M to 83B at 4B), Dolma (Table 7); fragments of 3 layers "
    "(Figure 6), each sync overlapped with one inner step and mixed in with alpha 0.5 "
    "(Figure 10), outer gradients in 4-bit floats (E3M0); Table 5's DiLoCo and Streaming "
    "rows are its M = 2 (they equal Table 6's M = 2 rows); the learning-rate tuning is "
    "not stated in the tables read; losses rounded to 0.01",
    "the paper's tables as arXiv's HTML renders them, reproduced in "
    "github.com/deep-diver/ai-paper-reviewer (content/paper-reviews/2501.18512/index.md); "
    "the running text and figures could not be opened here",
)

JAGHOUAR = Source(
    "jaghouar2024",
    "Jaghouar, Ong, Hagemann: OpenDiLoCo: An Open-Source Framework for Globally Distributed "
    "Low-Communication Training (arXiv 2407.07852v1, 2024)",
    "the abstract's finding that DiLoCo's outer gradients can be all-reduced in FP16 "
    "without any performance degradation (no number: the ablation is a figure)",
    "C4, a 150M model (DiLoCo's setting) and a 1.1B model, 8 workers",
    "the abstract, from arXiv's HTML",
)

LIN = Source(
    "lin2018",
    "Lin, Han, Mao, Wang, Dally: Deep Gradient Compression (arXiv 1712.01887, ICLR 2018)",
    "the abstract's finding: gradient compression of 270-600x without losing accuracy on "
    "image classification, speech and language modelling (Penn Treebank, a 2-layer LSTM)",
    "small models (ResNet, LSTM), not LLM pretraining: no loss figure taken from it",
    "the abstract",
)

SOURCES = {s.key: s for s in (BESIROGLU, CHARLES, DOUILLARD, JAGHOUAR, LIN)}

# Besiroglu et al.'s refit and what its own data say of it.
LAW = {"E": 1.8172, "A": 482.01, "B": 2085.43, "alpha": 0.3478, "beta": 0.3658}
LAW_PARAMS = (5.73e7, 1.62e10)
"""The parameters of the 240 runs the refit kept (from the replication's data file)."""
LAW_TOKENS = (8.2e8, 3.18e11)
"""Their tokens: training FLOPs / (6 N), as Hoffmann et al. count them."""
LAW_SPREAD = 0.0098
"""90% of those runs' losses lie within this fraction of the law (their 90th percentile
of |law / loss - 1|): the band in range."""
LAW_WORST = 0.0489
"""The largest |law / loss - 1| among them: the band where the law extrapolates."""
CHINCHILLA_TOKENS_PER_PARAM = 20
"""The compute-optimal token budget Charles et al. (Section 3.1) take from Hoffmann et al.:
D = 20 N; a job without a token budget of its own is given this one."""

# Charles et al. 2025.
CHARLES_FIT_H = 30
CHARLES_FITS: dict[int, tuple[float, float]] = {
    0: (18.129, -0.0953),  # 0: data parallelism
    1: (18.363, -0.0961),
    2: (18.768, -0.0969),
    4: (19.762, -0.0992),
    8: (21.051, -0.1018),
}
"""Table 7: (A, alpha) of L(N) = A N^alpha, by M (0 for data parallelism)."""
CHARLES_PARAMS = (35e6, 2.4e9)
"""The N their fits were made from (Table 4); Table 5 checked them at 4B and 10B."""
CHARLES_TABLE4: dict[float, tuple[float, float, float, float, float]] = {
    35e6: (3.485, 3.482, 3.508, 3.554, 3.621),
    90e6: (3.167, 3.162, 3.182, 3.213, 3.265),
    180e6: (2.950, 2.943, 2.957, 2.981, 3.019),
    335e6: (2.784, 2.777, 2.788, 2.808, 2.841),
    550e6: (2.653, 2.645, 2.657, 2.673, 2.698),
    1.3e9: (2.460, 2.451, 2.464, 2.472, 2.493),
    2.4e9: (2.326, 2.317, 2.323, 2.332, 2.351),
}
"""Table 4: evaluation loss of data parallelism and DiLoCo M = 1, 2, 4, 8 by N."""
CHARLES_M = (0, 1, 2, 4, 8)
"""The columns of CHARLES_TABLE4 (0: data parallelism)."""
CHARLES_TABLE5: dict[float, tuple[float, float, float, float]] = {
    4e9: (2.224, 2.219, 2.220, 2.230),
    10e9: (2.090, 2.086, 2.086, 2.096),
}
"""Table 5: data parallelism and DiLoCo M = 1, 2, 4 at 4B and 10B."""

# Douillard et al. 2025 (Streaming DiLoCo).
DOUILLARD_TOKENS = {35e6: 700e6, 100e6: 1.5e9, 200e6: 3.5e9, 300e6: 6e9, 500e6: 11e9,
                    1e9: 25e9, 4e9: 83e9}
"""Table 2: the Chinchilla-optimal token budget of each model size."""
DOUILLARD_TABLE5: dict[float, tuple[float, float | None, float | None, float]] = {
    35e6: (3.51, 3.54, 3.53, 3.56),
    100e6: (3.19, 3.21, 3.21, 3.22),
    200e6: (2.97, 2.98, 2.98, 3.00),
    300e6: (2.80, 2.81, 2.81, 2.83),
    500e6: (2.67, 2.68, 2.67, 2.69),
    1e9: (2.49, 2.49, 2.48, 2.50),
    4e9: (2.25, None, None, 2.26),
}
"""Table 5: data parallelism, DiLoCo H = 30, Streaming DiLoCo H = 30 and H = 100 (M = 2)."""
DOUILLARD_TABLE6: dict[float, dict[tuple[int, int], float]] = {
    35e6: {(2, 30): 3.53, (4, 30): 3.60, (2, 100): 3.56, (4, 100): 3.64},
    100e6: {(2, 30): 3.21, (4, 30): 3.25, (2, 100): 3.22, (4, 100): 3.29},
    200e6: {(2, 30): 2.98, (4, 30): 3.02, (2, 100): 3.00, (4, 100): 3.05},
    300e6: {(2, 30): 2.81, (4, 30): 2.84, (2, 100): 2.83, (4, 100): 2.87},
    500e6: {(2, 30): 2.67, (4, 30): 2.70, (2, 100): 2.69, (4, 100): 2.73},
    1e9: {(2, 30): 2.48, (4, 30): 2.50, (2, 100): 2.50, (4, 100): 2.53},
}
"""Table 6: Streaming DiLoCo with overlapped FP4 communication by (M, H)."""
DOUILLARD_TABLE7: dict[float, tuple[float, float, float]] = {
    25e9: (2.67, 2.66, 2.73),
    100e9: (2.52, 2.51, 2.54),
    250e9: (2.45, 2.45, 2.47),
}
"""Table 7: a 1B model on Dolma by tokens: data parallelism, Streaming DiLoCo M = 2, 4
(the paper's final configuration; the table does not state H)."""
DOUILLARD_LAYERS_PER_FRAGMENT = 3
DOUILLARD_OVERLAP = 1
DOUILLARD_MIXING = 0.5
DOUILLARD_H = (30, 100)
DOUILLARD_M = (2, 4)
DOUILLARD_PARAMS = (35e6, 4e9)
