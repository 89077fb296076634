"""Dataclasses to JSON-ready data and back, checked against their type hints: the control
protocol's messages (testbed.emulator.runtime.wire.messages), results.json's types
(testbed.report.run_results) and the planning store's answers (testbed.common.memo)
alike."""

from __future__ import annotations

import contextlib
import types
import typing
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields, is_dataclass
from enum import Enum
from typing import Annotated, Any, Literal, Union

JsonObject = dict[str, Any]
"""A JSON or YAML mapping as raw data: read from a file or the wire before it is checked
into a typed value, a file's document to edit as raw data (`raw`), made for a document of
an external format (a JSON Schema), keys users or policies choose, or the codec's own
generic to/from JSON. Not for values passed between parts of testbed: those have
dataclasses or TypedDicts (a file testbed writes too: a topology's, a job's, a trace's
events)."""



def raw(document: Mapping[str, Any]) -> JsonObject:
    """A document made as a TypedDict (a file's, as testbed writes it) as raw data: to
    edit as one would the file, before it is checked again."""
    return dict(document)


OMITTED = {"omitted": True}
"""Field metadata: a key written only when it has a value (absent, never null, otherwise)."""


@dataclass(frozen=True)
class Range:
    """Bounds of a number, in a field's type (`Annotated[int, Range(0)]`): the JSON Schema
    made from the types says them (`minimum`, `maximum`); reading data back does not
    check them (the schema does, first)."""

    minimum: float | None = None
    maximum: float | None = None

    def schema(self) -> dict[str, float]:
        return {k: v for k, v in (("minimum", self.minimum), ("maximum", self.maximum))
                if v is not None}


@dataclass(frozen=True)
class Open:
    """A TypedDict's mark in a field's type (`Annotated[PlanSummary, OPEN]`): readers in
    testbed read the block through its keys' types, while the JSON Schema made from the
    types leaves it an open object, as the block was before it had a type, so files
    written by earlier versions, and keys a later one adds, still validate."""


OPEN = Open()

Count = Annotated[int, Range(0)]
"""How many of something: never below zero."""
Positive = Annotated[int, Range(1)]
Seconds = Annotated[float, Range(0)]
"""A duration, or a time from a run's start."""
NonNegative = Annotated[float, Range(0)]


class DecodeError(ValueError):
    """Data that does not fit the type it is read as; the message says where."""



def to_json(value: Any) -> Any:
    """A dataclass (a message, or any part of one) as JSON-ready data; a class with a
    non-empty `op` class attribute also writes it, and a field marked `omitted` in its
    metadata is left out while it is None; an enum member as its value, a tuple as a
    list."""
    if isinstance(value, Enum):
        return value.value
    if is_dataclass(value) and not isinstance(value, type):
        op = getattr(value, "op", None)
        out: JsonObject = {"op": op} if op else {}
        names: dict[str, str] = getattr(value, "wire_names", {})
        for f in fields(value):
            field_value = getattr(value, f.name)
            if field_value is None and f.metadata == OMITTED:
                continue
            out[names.get(f.name, f.name)] = to_json(field_value)
        return out
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


_HINTS: dict[type[Any], dict[str, Any]] = {}
"""Each class's type hints by field name (the values are types, not data)."""


def _hints(cls: type[Any]) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


_KEYS: dict[type[Any], frozenset[str]] = {}


def _keys(cls: type[Any]) -> frozenset[str]:
    """The keys data of `cls` may hold: its fields (as named on the wire) and `op`."""
    if cls not in _KEYS:
        names: dict[str, str] = getattr(cls, "wire_names", {})
        _KEYS[cls] = frozenset({names.get(f.name, f.name) for f in fields(cls)} | {"op"})
    return _KEYS[cls]


def from_json(value: Any, hint: Any, where: str) -> Any:
    """`value` as `hint`, or DecodeError naming where it does not fit."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        return _union(value, typing.get_args(hint), where)
    if hint is Any:
        return value
    if origin is Literal:
        return _literal(value, typing.get_args(hint), where)
    if hint in (int, float, bool, str):
        return _scalar(value, hint, where)
    if origin is list:
        return _list(value, typing.get_args(hint)[0], where)
    if origin is tuple:
        return _tuple(value, typing.get_args(hint), where)
    if isinstance(hint, type) and issubclass(hint, Enum):
        return _enum(value, hint, where)
    if origin is dict or typing.is_typeddict(hint):
        return _mapping(value, hint, where)
    if isinstance(hint, type) and is_dataclass(hint):
        if not isinstance(value, dict):
            raise DecodeError(f"{where} is not an object")
        return build(hint, value, where)
    raise DecodeError(f"{where}: no rule for {hint!r}")


def _union(value: Any, args: tuple[Any, ...], where: str) -> Any:
    """The first of a union's members `value` fits, None where the union admits it."""
    if value is None and type(None) in args:
        return None
    for arg in args:
        if arg is not type(None):
            with contextlib.suppress(DecodeError):
                return from_json(value, arg, where)
    raise DecodeError(f"{where} is {type(value).__name__}")


def _literal(value: Any, choices: tuple[Any, ...], where: str) -> Any:
    if value not in choices:
        raise DecodeError(f"{where} is {str(value)[:40]!r}, not one of "
                          f"{', '.join(map(repr, choices))}")
    return value


def _scalar(value: Any, hint: type[Any], where: str) -> Any:
    """A bool is no int here (JSON tells them apart); an int is a float."""
    ok = isinstance(value, hint) and (hint is bool or not isinstance(value, bool))
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not ok:
        raise DecodeError(f"{where} is {type(value).__name__}, not {hint.__name__}")
    return value


def _list(value: Any, item: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise DecodeError(f"{where} is not a list")
    return [from_json(v, item, f"{where}[{i}]") for i, v in enumerate(value)]


def _tuple(value: Any, items: tuple[Any, ...], where: str) -> tuple[Any, ...]:
    """A JSON list as a tuple of any length (`tuple[X, ...]`) or of as many items as the
    hint names."""
    if not isinstance(value, list):
        raise DecodeError(f"{where} is not a list")
    if len(items) == 2 and items[1] is Ellipsis:
        items = (items[0],) * len(value)
    elif len(items) != len(value):
        raise DecodeError(f"{where} has {len(value)} items, not {len(items)}")
    return tuple(from_json(v, item, f"{where}[{i}]")
                 for i, (v, item) in enumerate(zip(value, items, strict=True)))


def _enum(value: Any, hint: type[Enum], where: str) -> Any:
    try:
        return hint(value)
    except (ValueError, TypeError):
        raise DecodeError(f"{where} is {str(value)[:40]!r}, not a {hint.__name__}") from None


def _mapping(value: Any, hint: Any, where: str) -> JsonObject:
    """A dict's values decoded by its value type; a TypedDict's left to its receiver."""
    if not isinstance(value, dict):
        raise DecodeError(f"{where} is not an object")
    if typing.get_origin(hint) is None:
        return value  # a TypedDict: its fields are the receiver's business
    _, item = typing.get_args(hint)
    return {str(k): from_json(v, item, f"{where}.{k}") for k, v in value.items()}


def build(cls: type[Any], data: JsonObject, where: str) -> Any:
    """An instance of dataclass `cls` from `data`; DecodeError naming what is wrong, a key
    `cls` does not have among it."""
    names: dict[str, str] = getattr(cls, "wire_names", {})
    hints = _hints(cls)
    unknown = data.keys() - _keys(cls)
    if unknown:
        raise DecodeError(f"{where}: {cls.__name__} has no {', '.join(sorted(unknown))}")
    values: dict[str, Any] = {}  # cls's keyword arguments, each decoded as its field's type
    for f in fields(cls):
        key = names.get(f.name, f.name)
        if key not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise DecodeError(f"{where}: missing {key!r}")
            continue
        values[f.name] = from_json(data[key], hints[f.name], f"{where}.{key}")
    return cls(**values)


