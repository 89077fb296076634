"""Dataclasses to JSON-ready data and back, checked against their type hints: the
control protocol's encoding (testbed.runtime.wire.messages), usable for any frozen record."""

from __future__ import annotations

import contextlib
import types
import typing
from dataclasses import MISSING, fields, is_dataclass
from typing import Any, Literal, Union

from testbed.runtime.wire.protocol import ProtocolError


def to_json(value: Any) -> Any:
    """A dataclass (a message, or any part of one) as JSON-ready data; a class with a
    non-empty `op` class attribute also writes it."""
    if is_dataclass(value) and not isinstance(value, type):
        op = getattr(value, "op", None)
        out: dict[str, Any] = {"op": op} if op else {}
        names: dict[str, str] = getattr(value, "wire_names", {})
        for f in fields(value):
            out[names.get(f.name, f.name)] = to_json(getattr(value, f.name))
        return out
    if isinstance(value, list | tuple):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    return value


_HINTS: dict[type[Any], dict[str, Any]] = {}


def _hints(cls: type[Any]) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


def from_json(value: Any, hint: Any, where: str) -> Any:
    """`value` as `hint`, or ProtocolError naming where it does not fit."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is not type(None):
                with contextlib.suppress(ProtocolError):
                    return from_json(value, arg, where)
        raise ProtocolError(f"{where} is {type(value).__name__}")
    if hint is Any:
        return value
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ProtocolError(f"{where} is {str(value)[:40]!r}, not one of "
                                f"{', '.join(map(repr, typing.get_args(hint)))}")
        return value
    if hint in (int, float, bool, str):
        ok = isinstance(value, hint) and (hint is bool or not isinstance(value, bool))
        if hint is float and isinstance(value, int) and not isinstance(value, bool):
            ok = True
        if not ok:
            raise ProtocolError(f"{where} is {type(value).__name__}, not {hint.__name__}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError(f"{where} is not a list")
        (item,) = typing.get_args(hint)
        return [from_json(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict or typing.is_typeddict(hint):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} is not an object")
        if origin is None:
            return value  # a TypedDict: its fields are the receiver's business
        _, item = typing.get_args(hint)
        return {str(k): from_json(v, item, f"{where}.{k}") for k, v in value.items()}
    if isinstance(hint, type) and is_dataclass(hint):
        if not isinstance(value, dict):
            raise ProtocolError(f"{where} is not an object")
        return build(hint, value, where)
    raise ProtocolError(f"{where}: no rule for {hint!r}")


def build(cls: type[Any], data: dict[str, Any], where: str) -> Any:
    """An instance of dataclass `cls` from `data`; ProtocolError naming what is wrong."""
    names: dict[str, str] = getattr(cls, "wire_names", {})
    hints = _hints(cls)
    values: dict[str, Any] = {}
    for f in fields(cls):
        key = names.get(f.name, f.name)
        if key not in data:
            if f.default is MISSING and f.default_factory is MISSING:
                raise ProtocolError(f"{where}: missing {key!r}")
            continue
        values[f.name] = from_json(data[key], hints[f.name], f"{where}.{key}")
    return cls(**values)


