from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.common.units import (
    format_duration,
    format_fraction,
    format_rate,
    format_size,
    parse_duration,
    parse_flops,
    parse_fraction,
    parse_rate,
    parse_size,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("40ms", 0.04),
        ("1.5s", 1.5),
        ("200us", 2e-4),
        ("0", 0.0),
        (3, 3.0),
        ("2 ms", 0.002),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("text", "bps"),
    [
        ("10Gbit", 1e10),
        ("500Mbit", 5e8),
        ("1gbps", 1e9),
        ("100kbit", 1e5),
        ("2.5Gbit/s", 2.5e9),
    ],
)
def test_rates(text: str, bps: float) -> None:
    assert parse_rate(text) == pytest.approx(bps)


def test_sizes_fractions_flops() -> None:
    assert parse_size("4MiB") == 4 * 1024**2
    assert parse_size("64KB") == 64000
    assert parse_fraction("1%") == pytest.approx(0.01)
    assert parse_fraction(0.5) == 0.5
    assert parse_flops("312TFLOPS") == 312e12
    assert parse_flops("989 TFLOP/s") == 989e12


@pytest.mark.parametrize("bad", ["-40ms", "40 parsecs", "", "ms", "1e400ms", None, True, [1]])
def test_bad_durations_are_value_errors(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize("bad", ["150%", "-1%", "1 percent"])
def test_bad_fractions(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_fraction(bad)


@given(st.floats(min_value=0, max_value=1e4, allow_nan=False))
def test_duration_round_trip(value: float) -> None:
    assert parse_duration(format_duration(value)) == value


@given(st.floats(min_value=0, max_value=1e13, allow_nan=False))
def test_rate_round_trip(value: float) -> None:
    assert parse_rate(format_rate(value)) == value


@given(st.integers(min_value=0, max_value=2**40))
def test_size_round_trip(value: int) -> None:
    assert parse_size(format_size(value)) == value


@given(st.floats(min_value=0, max_value=1, allow_nan=False))
def test_fraction_round_trip(value: float) -> None:
    assert math.isclose(parse_fraction(format_fraction(value)), value, rel_tol=0, abs_tol=0)
