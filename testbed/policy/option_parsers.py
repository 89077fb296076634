"""Parsers for policies' `-o name=value` settings: a bad value raises ValueError with the
reason, which the registry turns into a one-line error before any planning starts."""

from __future__ import annotations

from collections.abc import Callable

from testbed.errors import did_you_mean

_TRUE = ("on", "true", "yes", "1")
_FALSE = ("off", "false", "no", "0")


def at_least_one(text: str) -> int:
    """A whole number of 1 or more (a count: connections, steps)."""
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    """A whole number of 0 or more."""
    value = int(text)
    if value < 0:
        raise ValueError("must not be negative")
    return value


def non_negative(text: str) -> float:
    """A number of 0 or more (not NaN)."""
    value = float(text)
    if not value >= 0:  # NaN too
        raise ValueError("must not be negative")
    return value


def positive(text: str) -> float:
    """A finite number above 0 (a rate, a learning rate)."""
    value = float(text)
    if not 0 < value < float("inf"):
        raise ValueError("must be a positive number")
    return value


def payload(text: str) -> str:
    """A compressed payload for an all-reduce: int8, int4, fp4 or topP%."""
    from testbed.plan.collective import check_payload

    if text in ("", "fp32", "bf16", "fp16"):
        raise ValueError("a compressed payload: int8, int4, fp4 or topP% (P from 0 to 100)")
    return check_payload(text)


def bucket_size(text: str) -> float:
    """A bucket size in MiB for all-reduces that start as the backward has their values
    (torch DDP's `bucket_cap_mb`); 0 turns buckets off: one all-reduce after the backward."""
    value = non_negative(text)
    if value == float("inf"):
        raise ValueError("must be finite (0 turns buckets off)")
    return value


def fraction(text: str) -> float:
    """At least 0 and below 1."""
    value = float(text)
    if not 0 <= value < 1:
        raise ValueError("a fraction from 0 to 1")
    return value


def on_off(text: str) -> bool:
    """A switch: on, true, yes or 1; off, false, no or 0."""
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError("on or off")


def option_text(value: object) -> str:
    """A setting as `-o name=value` takes it: `on`/`off` for a switch (on_off's values)."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def one_of(*choices: str) -> Callable[[str], str]:
    """A parser accepting exactly `choices`."""

    def parse(text: str) -> str:
        if text not in choices:
            raise ValueError(f"one of {', '.join(choices)}{did_you_mean(text, choices)}")
        return text

    return parse
