"""The job's `data`: the corpus real compute trains on, found and checked when the job is
read, so a run never starts on a file it cannot use."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, TypedDict

from testbed.common.fields import Fields, text
from testbed.job.model import DATA_FORMATS, DataFile, DataFormat, ModelShape

BYTE_VOCAB = 256
"""Text is read as bytes: any of 256 values may occur."""


def parse_data(fields: Fields, name: str, shape: ModelShape, base: Path) -> DataFile | None:
    """`data`: absent (the synthetic corpus), a path (its format from its extension), or
    {path, format}; a relative path starts at `base`, the folder of the file naming it."""
    value = fields.raw(name, None)
    if value is None:
        return None
    key = name
    if isinstance(value, str):
        where, fmt = value, None
    else:
        spec = Fields(value, fields.source, fields.key(name))
        where, fmt = spec.get("path", text), spec.get("format", _format, None)
        spec.done()
        key = f"{name}.path"
    if not where:
        raise fields.error(key, "expected a path, got ''")
    path = os.path.abspath(base / Path(where).expanduser())
    if fmt is None:
        fmt = DATA_FORMATS.get(Path(path).suffix)
        if fmt is None:
            raise fields.error(key, f"cannot tell the format of {path} from its extension "
                               "(.txt is text, .bin uint16 tokens): give data: {path: F, "
                               "format: text|uint16}")
    from testbed.job.tokens import open_tokens  # numpy: only a job with a data file reads one

    try:
        tokens = open_tokens(path, fmt)
    except ValueError as exc:
        raise fields.error(key, str(exc)) from None
    problem = _unfit(tokens, fmt, shape)
    if problem:
        raise fields.error(name, f"{path}: {problem}")
    return DataFile(path, fmt, len(tokens))


def _unfit(tokens: Any, fmt: DataFormat, shape: ModelShape) -> str | None:
    """Why the model cannot train on these tokens, if it cannot.

    One sequence (seq_len + 1 tokens) is the least a corpus must hold, not one iteration's
    batch: samples are windows that every epoch takes anew (testbed.job.tokens), so a
    short corpus only repeats sooner; and the batch is not known here (the policy may
    choose dp)."""
    needed = shape.seq_len + 1
    if len(tokens) < needed:
        return (f"holds {len(tokens)} tokens; one sequence needs seq_len + 1 = {needed}")
    if fmt == "text":
        if shape.vocab < BYTE_VOCAB:
            return (f"text is read as bytes (256 token values); model vocab {shape.vocab} "
                    f"is too small: set model.vocab to {BYTE_VOCAB} or more")
        return None
    import numpy as np

    largest = int(np.max(tokens))  # a memory-mapped scan: no copy of the file
    if largest >= shape.vocab:
        return (f"holds token id {largest}; model vocab {shape.vocab} must be above it "
                "(set model.vocab)")
    return None


def _format(value: Any) -> DataFormat:
    for fmt in DATA_FORMATS.values():
        if value == fmt:
            return fmt
    raise ValueError(f"unknown format {value!r} (text or uint16)")


class DataSection(TypedDict):
    """The section as the job file writes it (dump_data)."""

    path: str
    format: DataFormat


def dump_data(data: DataFile) -> DataSection:
    """What `parse_data` reads back to an equal DataFile."""
    return {"path": data.path, "format": data.format}
