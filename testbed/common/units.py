"""Quantities written the way people write them: `40ms`, `10Gbit`, `4MiB`, `1%`.

Parsers raise ValueError with a short reason; callers attach the file and key.
Formatters produce the shortest exact text that parses back to the same value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

_NUMBER = r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)"
_QUANTITY = re.compile(rf"^\s*{_NUMBER}\s*([A-Za-z%/]*)\s*$")

_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0}
_RATE_UNITS = {
    "bit": 1.0,
    "kbit": 1e3,
    "mbit": 1e6,
    "gbit": 1e9,
    "tbit": 1e12,
    "bps": 1.0,
    "kbps": 1e3,
    "mbps": 1e6,
    "gbps": 1e9,
    "tbps": 1e12,
}
_SIZE_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def _split(text: object, what: str) -> tuple[float, str]:
    if isinstance(text, bool):
        raise ValueError(f"expected a {what}, got {text!r}")
    if isinstance(text, int | float):
        if not math.isfinite(text):
            raise ValueError(f"expected a finite {what}, got {text!r}")
        if text < 0:
            raise ValueError(f"must not be negative, got {text!r}")
        return float(text), ""
    if not isinstance(text, str):
        raise ValueError(f"expected a {what}, got {text!r}")
    match = _QUANTITY.match(text)
    if not match:
        if text.strip().startswith("-"):
            raise ValueError(f"must not be negative, got {text!r}")
        raise ValueError(f"expected a {what} like {_EXAMPLES[what]}, got {text!r}")
    value = float(match.group(1))
    if not math.isfinite(value):
        raise ValueError(f"expected a finite {what}, got {text!r}")
    return value, match.group(2)


_EXAMPLES = {
    "duration": "'40ms'",
    "rate": "'10Gbit'",
    "size": "'4MiB'",
    "fraction": "'1%'",
    "FLOP rate": "'312TFLOPS'",
    "count": "'1000'",
}


def parse_duration(text: object) -> float:
    """Seconds from `40ms`, `1.5s`, `200us`; a bare number is seconds."""
    value, unit = _split(text, "duration")
    if unit == "":
        return value
    if unit not in _TIME_UNITS:
        raise ValueError(f"unknown time unit {unit!r} in {text!r} (use s, ms, us)")
    return value * _TIME_UNITS[unit]


def parse_rate(text: object) -> float:
    """Bits per second from `10Gbit`, `500Mbit`, `1gbps`; a bare number is bit/s."""
    value, unit = _split(text, "rate")
    key = unit.lower().removesuffix("/s")
    if key == "":
        return value
    if key not in _RATE_UNITS:
        raise ValueError(f"unknown rate unit {unit!r} in {text!r} (use bit, Kbit, Mbit, Gbit)")
    return value * _RATE_UNITS[key]


def parse_size(text: object) -> int:
    """Bytes from `4MiB`, `64KB`, `1500B`; a bare number is bytes."""
    value, unit = _split(text, "size")
    key = unit.lower()
    if key == "":
        factor = 1
    elif key in _SIZE_UNITS:
        factor = _SIZE_UNITS[key]
    else:
        raise ValueError(f"unknown size unit {unit!r} in {text!r} (use B, KB, MB, KiB, MiB)")
    result = value * factor
    if result != int(result):
        raise ValueError(f"size must be a whole number of bytes, got {text!r}")
    return int(result)


def parse_fraction(text: object) -> float:
    """A fraction in [0, 1] from `1%` or `0.01`."""
    value, unit = _split(text, "fraction")
    if unit == "%":
        value /= 100.0
    elif unit != "":
        raise ValueError(f"expected a percentage like '1%', got {text!r}")
    if value > 1.0:
        bare = "" if unit else f" (a bare number is a fraction: {value:g}% or {value / 100:g})"
        raise ValueError(f"must be at most 100%, got {text!r}{bare}")
    return value


def parse_flops(text: object) -> float:
    """FLOP/s from `312TFLOPS`, `989 TFLOP/s`; a bare number is TFLOP/s."""
    value, unit = _split(text, "FLOP rate")
    key = unit.lower().removesuffix("/s").removesuffix("s")
    scale = {"": 1e12, "flop": 1.0, "gflop": 1e9, "tflop": 1e12, "pflop": 1e15}
    if key not in scale:
        raise ValueError(f"unknown FLOP rate unit {unit!r} in {text!r} (use TFLOPS)")
    return value * scale[key]


def format_duration(seconds: float) -> str:
    return _format(seconds, (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)), "s", parse_duration)


def format_rate(bps: float) -> str:
    units = (("Tbit", 1e12), ("Gbit", 1e9), ("Mbit", 1e6), ("Kbit", 1e3))
    return _format(bps, units, "bit", parse_rate)


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale}{unit}"
    return f"{nbytes}B"


def format_fraction(value: float) -> str:
    return _format(value, (("%", 0.01),), "", parse_fraction)


def format_flops(flops: float) -> str:
    return _format(flops, (("TFLOPS", 1e12),), "FLOPS", parse_flops)


def _format(
    value: float,
    units: tuple[tuple[str, float], ...],
    base: str,
    parse: Callable[[str], float],
) -> str:
    """The largest unit whose text parses back to exactly `value`, else the base unit."""
    for unit, scale in units:
        if value >= scale or (value > 0 and unit == units[-1][0]):
            text = f"{_short(value / scale)}{unit}"
            if parse(text) == value:
                return text
    return f"{_short(value)}{base}"


def _short(value: float) -> str:
    """Shortest decimal text for `value` that round-trips through float()."""
    text = repr(float(value))
    if text.endswith(".0"):
        text = text[:-2]
    return text


def human_rate(bps: float) -> str:
    """Rounded for tables, not for round trips."""
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("Kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:.3g} {unit}"
    return f"{bps:.3g} bit/s"


def human_bytes(nbytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes:.0f} B"


def human_duration(seconds: float) -> str:
    if seconds >= 1.0:
        return f"{seconds:.3g} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds * 1e6:.3g} us"


def plural(count: int, word: str, many: str | None = None) -> str:
    """`1 datacenter`, `2 datacenters` (`many` where adding an s is wrong)."""
    return f"{count:,} {word if count == 1 else many or word + 's'}"
