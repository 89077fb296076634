"""JSON in, bounded: every JSON file testbed reads back (results, spans, comparisons,
checkpoints, sweeps, run state) goes through here, so none is read past its size or
nests past MAX_NESTING, and each problem is one line naming the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson

from testbed.common.input_files import MAX_NESTING, MIB, read_bounded
from testbed.errors import InputError

MAX_JSON_BYTES = 64 * MIB
"""A file that describes a run or a set of them (results.json, compare.json, sweep.json,
run.json, a profile): results.json holds the plan, about 150 KB for gpt3-4dc's 1,024
GPUs, so about 10 MB at the 65,536 GPUs a topology may have (testbed.common.sizes)."""
MAX_RECORD_BYTES = 2048 * MIB
"""A file that grows with a run's length (spans.json, a checkpoint's state.json, which
carries the spans so far, a sweep's points.jsonl): spans.json takes about 170 KB per
iteration of paper-3dc and 8.4 MB per iteration of gpt3-4dc, so 10,000 iterations of the
one or 240 of the other, about as much as a machine's memory holds simulated."""


def read_json(path: Path, limit: int = MAX_JSON_BYTES, *, follow: bool = True) -> Any:
    """The JSON value in `path`, a regular file of at most `limit` bytes, or an InputError
    naming it (`follow=False`: a symbolic link is refused, not followed)."""
    return parse_json(read_bounded(path, limit, follow=follow), str(path))


def parse_json(text: bytes | str, source: str | None, key: str | None = None) -> Any:
    """`text` as a JSON value, or an InputError naming `source` (and `key`)."""
    try:
        return loads(text)
    except NestedTooDeep as exc:
        raise InputError(str(exc), source, exc.key or key) from None
    except ValueError as exc:
        raise InputError(f"unreadable: {exc}", source, key) from None


class NestedTooDeep(ValueError):
    def __init__(self, key: str | None) -> None:
        super().__init__(f"nested deeper than {MAX_NESTING} levels of lists and mappings")
        self.key = key
        """The top-level key under which it goes too deep, where there is one."""


def loads(text: bytes | str) -> Any:
    """JSON text as values (orjson; the standard library's reader for the NaN and Infinity
    that files of older versions may hold); ValueError when it is not JSON or nests past
    MAX_NESTING (NestedTooDeep)."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:  # orjson gives up past 1,024 levels; the standard library's reader recurses
            value = json.loads(text, parse_constant=float)
        except RecursionError:
            raise NestedTooDeep(None) from None
    check_nesting(value)
    return value


def check_nesting(value: Any) -> None:
    """NestedTooDeep where `value` has lists or mappings more than MAX_NESTING deep,
    naming the top-level key it is under. Walked a level at a time, without recursion
    (this is what keeps the rest of testbed from recursing): about 0.2 s for the 25 MB
    spans.json of 3 iterations of gpt3-4dc."""
    if isinstance(value, dict):
        for key, inner in value.items():
            if _depth_over(inner, MAX_NESTING - 1):
                raise NestedTooDeep(str(key))
    elif _depth_over(value, MAX_NESTING):
        raise NestedTooDeep(None)


def _depth_over(value: Any, limit: int) -> bool:
    level = [value] if type(value) is dict or type(value) is list else []
    for _ in range(limit):
        below: list[Any] = []
        for item in level:
            below += [c for c in (item.values() if type(item) is dict else item)
                      if type(c) is dict or type(c) is list]
        if not below:
            return False
        level = below
    return True
