"""Reading nested YAML mappings with errors that name the file, the key path and the problem."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, TypeVar

from testbed.errors import InputError, did_you_mean, join_key

T = TypeVar("T")
_MISSING: Any = object()


class Fields:
    """A mapping being read: every read is checked, every unread key is an error.

    `keys`, every key the mapping may hold, lets a misspelled key be named as such even
    when the key it stands for is required and reported first ("bandwith: unknown key
    (did you mean 'bandwidth'?)", not "bandwidth: missing value")."""

    def __init__(self, data: object, source: str | None, path: str = "",
                 keys: Collection[str] = ()) -> None:
        if not isinstance(data, Mapping):
            raise InputError(f"expected a mapping, got {_kind(data)}", source, path or None)
        for key in data:
            if not isinstance(key, str):
                raise InputError(f"keys must be text, got {key!r}", source, path or None)
        self.data: Mapping[str, Any] = data
        self.source = source
        self.path = path
        self.keys = frozenset(keys)
        self._read: set[str] = set()

    def key(self, name: str | int) -> str:
        return join_key(self.path, name)

    def error(self, name: str | int | None, problem: str) -> InputError:
        return InputError(problem, self.source, self.key(name) if name is not None else self.path)

    def has(self, name: str) -> bool:
        return name in self.data

    def raw(self, name: str, default: Any = _MISSING) -> Any:
        self._read.add(name)
        if name not in self.data or self.data[name] is None:
            if default is _MISSING:
                self._misspelling_of(name)
                raise self.error(name, "missing value")
            return default
        return self.data[name]

    def get(self, name: str, parse: Callable[[Any], T], default: Any = _MISSING) -> T:
        """Parse `name` with `parse`; a ValueError becomes a located InputError."""
        value = self.raw(name, _MISSING if default is _MISSING else None)
        if value is None:
            return default  # type: ignore[no-any-return]
        try:
            return parse(value)
        except InputError as exc:
            raise exc.at(self.source) from None
        except (ValueError, TypeError) as exc:
            raise self.error(name, str(exc)) from None

    def section(self, name: str, required: bool = False,
                keys: Collection[str] = ()) -> Fields | None:
        value = self.raw(name, _MISSING if required else None)
        if value is None:
            return None
        return Fields(value, self.source, self.key(name), keys)

    def items(self, name: str, required: bool = False) -> Iterator[tuple[str, Any]]:
        """(key path, value) for each element of a list under `name`."""
        value = self.raw(name, _MISSING if required else None)
        if value is None:
            return
        if not isinstance(value, list):
            raise self.error(name, f"expected a list, got {_kind(value)}")
        for index, item in enumerate(value):
            yield join_key(self.key(name), index), item

    def done(self) -> None:
        """Reject keys nobody read: a typo must not pass silently."""
        unknown = [key for key in self.data if key not in self._read]
        if unknown:
            raise self._unknown(unknown[0], self._read | self.keys)

    def _unknown(self, key: str, known: Collection[str]) -> InputError:
        hint = did_you_mean(key, known)
        listed = ", ".join(sorted(known)) or "none"
        return self.error(key, f"unknown key{hint or f' (known keys: {listed})'}")

    def check_keys(self) -> None:
        """Refuse now a key outside `keys`, for a reader that must know which keys are
        given before it has read them all."""
        strangers = [key for key in self.data if key not in self.keys | self._read]
        if strangers:
            raise self._unknown(strangers[0], self.keys | self._read)

    def _misspelling_of(self, name: str) -> None:
        """A required `name` is missing: if a key this mapping cannot hold is close to
        it, that key is the error (a typo), not the missing one."""
        if not self.keys:
            return
        strangers = [key for key in self.data if key not in self.keys | self._read]
        for key in strangers:
            if did_you_mean(key, [name]):
                raise self.error(key, f"unknown key{did_you_mean(key, [name])}")


def positive(parse: Callable[[Any], T], allow_zero: bool = False) -> Callable[[Any], T]:
    """Wrap a parser so that negative (and by default zero) values are refused."""

    def check(value: Any) -> T:
        result = parse(value)
        number = float(result)  # type: ignore[arg-type]
        if number < 0 or (number == 0 and not allow_zero):
            raise ValueError(
                f"must be {'zero or more' if allow_zero else 'positive'}, got {value!r}"
            )
        return result

    return check


def at_most(parse: Callable[[Any], int], limit: int) -> Callable[[Any], int]:
    """Wrap a parser so that counts above `limit` (one of testbed.common.sizes) are refused."""

    def check(value: Any) -> int:
        result = parse(value)
        if result > limit:
            raise ValueError(f"must be at most {limit:,} (testbed's limit), got {value!r}")
        return result

    return check


def bounded(parse: Callable[[Any], float], low: float, high: float,
            show: Callable[[float], str]) -> Callable[[Any], float]:
    """Wrap a parser so that values outside [low, high] are refused, naming the range."""

    def check(value: Any) -> float:
        result = parse(value)
        if not low <= result <= high:
            raise ValueError(f"must be from {show(low)} to {show(high)}, got {value!r}")
        return result

    return check


def integer(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ValueError(f"expected a whole number, got {value!r}")
    return value


def text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected text, got {value!r}")
    return value


def string(value: Any) -> str:
    """Any text, the empty one included."""
    if not isinstance(value, str):
        raise ValueError(f"expected text, got {value!r}")
    return value


def boolean(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"expected a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"expected a finite number, got {value!r}")
    return float(value)


def _kind(value: object) -> str:
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return f"text {value!r}"
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}"
