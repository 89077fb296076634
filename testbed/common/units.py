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
_PREFIXES = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12,
             "ki": 1024.0, "mi": 1024.0**2, "gi": 1024.0**3, "ti": 1024.0**4}
_RATE_UNIT = re.compile(r"^(?P<prefix>[kmgt]i?)?(?:(?P<bit>bits?)(?:/s)?|(?P<b>b)(?:ps|/s))$",
                        re.IGNORECASE)
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
    """Bits per second from `10Gbit`, `500Mbit/s`, `10Gbps` or bytes per second from
    `1.25GB/s`, `10MBps`, `1GiB/s`; a bare number is bit/s.

    Case tells bits from bytes where it can: `bit` in any case is bits; `b` is bits and `B`
    bytes in `Mbps`, `MBps`, `Mb/s`, `MB/s`. A spelling in one case only (`mbps`, `MBPS`)
    cannot tell them apart, and tc reads `mbps` as megabytes per second where networking
    reads megabits: it is refused, naming both readings."""
    value, unit = _split(text, "rate")
    if unit == "":
        return value
    match = _RATE_UNIT.match(unit)
    if not match:
        raise ValueError(f"unknown rate unit {unit!r} in {text!r} "
                         "(use bit, Kbit, Mbit, Gbit, or bytes per second as MB/s)")
    scale = _PREFIXES[(match["prefix"] or "").lower()]
    if match["bit"] or (match["b"] == "b" and not unit.islower()):
        return value * scale
    if match["b"] == "B" and not unit.isupper():
        return value * scale * 8
    number = str(text).strip()[: -len(unit)].strip()
    prefix = (match["prefix"] or "").capitalize()
    bits, nbytes = f"{number} {prefix}bit/s", f"{number} {prefix}B/s"
    if unit.lower().endswith("ps"):  # tc's spelling, which tc reads as bytes in any case
        bits, nbytes = f"{bits} (networking)", f"{nbytes} (tc)"
    raise ValueError(f"{text!r} is ambiguous: {bits} or {nbytes}; write {number}{prefix}bit "
                     f"or {number}{prefix}B/s")


def parse_per_second(text: object) -> float:
    """Events per second from `20/s`, `1200/min` or `1/5s`; a bare number is per second."""
    count, per = text, "s"
    if isinstance(text, str) and "/" in text:
        count, _, per = text.partition("/")
        per = per.strip()
    try:
        value, unit = _split(count, "count")
        seconds = parse_duration(per if per[:1].isdigit() or per[:1] == "." else "1" + per)
    except ValueError:
        value, unit, seconds = 0.0, "?", 0.0
    if unit or seconds <= 0 or not math.isfinite(value / seconds):
        raise ValueError(f"expected a count per time like '20/s' or '1200/min', got {text!r}")
    return value / seconds


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
