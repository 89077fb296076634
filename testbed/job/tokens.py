"""A corpus file's tokens, memory-mapped, and which window of them each sample takes.

Memory-mapped, not read: every worker is its own process, and a corpus may be larger than
one worker's share of memory; the page cache holds the file once for all of them. No
torch here: the job file's checks use it too (testbed.job.data).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

from testbed.job.model import DataFormat

TOKEN_DTYPES: dict[DataFormat, np.dtype[np.unsignedinteger]] = {
    "text": np.dtype(np.uint8), "uint16": np.dtype("<u2")}
Tokens = npt.NDArray[np.unsignedinteger]


def open_tokens(path: str, format: DataFormat) -> Tokens:
    """The file's tokens, read-only and memory-mapped; ValueError saying why not."""
    dtype = TOKEN_DTYPES[format]
    try:
        size = os.stat(path).st_size
        if not os.path.isfile(path):
            raise ValueError(f"{path} is not a file")
        if size % dtype.itemsize:
            raise ValueError(f"{path} has an odd size ({size} bytes): uint16 tokens take "
                             "2 bytes each")
        if size == 0:  # an empty file cannot be mapped
            return np.zeros(0, dtype)
        return np.memmap(path, dtype, mode="r")
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None


def window_start(index: int, seed: int, tokens: int, seq_len: int) -> int:
    """First token of sample `index` (seq_len + 1 tokens: inputs and shifted targets).

    The corpus is cut into windows seq_len apart (each one's last token is the next one's
    first), and every epoch takes all of them once, in an order drawn from (seed, epoch):
    slot s of an epoch is window (a s + b) mod W, with a coprime to W. So samples are
    distinct until the corpus is used up (replicas and microbatches never share one),
    deterministic, and found in constant time and memory: a shuffled list of windows
    would cost every worker 8 bytes per window, gigabytes for a large corpus."""
    windows = (tokens - 1) // seq_len
    epoch, slot = divmod(index, windows)
    stride, shift = _epoch_order(seed, epoch, windows)
    return (stride * slot + shift) % windows * seq_len


@lru_cache(maxsize=16)
def _epoch_order(seed: int, epoch: int, windows: int) -> tuple[int, int]:
    """(a, b) of the epoch's order: a in [1, W) coprime to W, b in [0, W)."""
    generator = np.random.default_rng([seed, epoch])
    shift = int(generator.integers(windows))
    stride = 1
    while windows > 2:
        stride = int(generator.integers(1, windows))
        if math.gcd(stride, windows) == 1:
            break
    return stride, shift


@dataclass(frozen=True, eq=False)
class TokenWindows:
    """Samples of a token file: sample `index` is the window `window_start` gives."""

    tokens: Tokens
    seq_len: int
    seed: int

    def sample(self, index: int) -> npt.NDArray[np.int64]:
        start = window_start(index, self.seed, len(self.tokens), self.seq_len)
        return np.array(self.tokens[start : start + self.seq_len + 1], dtype=np.int64)
