"""JSON written as it is made, with orjson: a large run's spans and trace are millions of
items, which neither need to sit in memory as one text nor go through the standard
library's encoder (several times slower). Numbers JSON cannot hold (NaN, infinities) are
written as null, as every reader takes them."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any, Protocol

import orjson


class Output(Protocol):
    def write(self, data: bytes, /) -> object: ...


BATCH = 20_000
"""Items encoded at once: large enough that each call's overhead vanishes."""


def dumps(value: Any, indent: bool = False) -> bytes:
    """`value` as JSON: keys that are not text written as text, anything else JSON has no
    form for as its str()."""
    options = orjson.OPT_NON_STR_KEYS | (orjson.OPT_INDENT_2 if indent else 0)
    return orjson.dumps(value, default=str, option=options)


def write_json_items(out: Output, head: bytes, items: Iterable[Any], tail: bytes) -> None:
    """`head`, then the items as the elements of a JSON array, then `tail`: the caller's
    head opens the array (`[` or `{"key": [`) and its tail closes it."""
    out.write(head)
    first = True
    iterator = iter(items)
    while batch := list(itertools.islice(iterator, BATCH)):
        if not first:
            out.write(b",")
        out.write(dumps(batch)[1:-1])
        first = False
    out.write(tail)
