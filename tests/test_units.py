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
    parse_per_second,
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
        # bits: `bit` in any case, `b` lower case beside an upper-case letter
        ("10Gbit", 1e10),
        ("500Mbit", 5e8),
        ("100kbit", 1e5),
        ("100Kbit", 1e5),
        ("10gbit", 1e10),
        ("10GBIT", 1e10),
        ("1Tbit", 1e12),
        ("2.5Gbit/s", 2.5e9),
        ("10 Gbits/s", 1e10),
        ("1Gibit", 2.0**30),
        ("10Gbps", 1e10),
        ("10Mbps", 1e7),
        ("10Kbps", 1e4),
        ("1Tbps", 1e12),
        ("10Gb/s", 1e10),
        ("10Mb/s", 1e7),
        ("1e9", 1e9),
        (1e9, 1e9),
        # bytes: `B` upper case beside a lower-case letter, times 8
        ("10GBps", 8e10),
        ("10MBps", 8e7),
        ("10KBps", 8e4),
        ("100Bps", 800.0),
        ("1.25GB/s", 1e10),
        ("10MB/s", 8e7),
        ("10kB/s", 8e4),
        ("10B/s", 80.0),
        ("1GiB/s", 8 * 2.0**30),
        ("1MiBps", 8 * 2.0**20),
    ],
)
def test_rates(text: object, bps: float) -> None:
    assert parse_rate(text) == bps


@pytest.mark.parametrize(
    ("text", "bits", "nbytes", "write"),
    [
        # tc's spellings, which tc reads as bytes in any case; networking reads bits
        ("10mbps", "10 Mbit/s (networking)", "10 MB/s (tc)", "10Mbit or 10MB/s"),
        ("1gbps", "1 Gbit/s (networking)", "1 GB/s (tc)", "1Gbit or 1GB/s"),
        ("10kbps", "10 Kbit/s (networking)", "10 KB/s (tc)", "10Kbit or 10KB/s"),
        ("8bps", "8 bit/s (networking)", "8 B/s (tc)", "8bit or 8B/s"),
        ("10MBPS", "10 Mbit/s (networking)", "10 MB/s (tc)", "10Mbit or 10MB/s"),
        ("10 GBPS", "10 Gbit/s (networking)", "10 GB/s (tc)", "10Gbit or 10GB/s"),
        ("1gibps", "1 Gibit/s (networking)", "1 GiB/s (tc)", "1Gibit or 1GiB/s"),
        # one case only, where b and B cannot be told apart
        ("10mb/s", "10 Mbit/s", "10 MB/s", "10Mbit or 10MB/s"),
        ("10GB/S", "10 Gbit/s", "10 GB/s", "10Gbit or 10GB/s"),
    ],
)
def test_ambiguous_rates_are_refused_naming_both_readings(
        text: str, bits: str, nbytes: str, write: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_rate(text)
    assert str(info.value) == f"{text!r} is ambiguous: {bits} or {nbytes}; write {write}"


@pytest.mark.parametrize("bad", ["10Gb", "10GB", "20/s", "10 parsecs/s", "10Gbitps", "-1Gbit"])
def test_unknown_rate_units_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=r"unknown rate unit|must not be negative"):
        parse_rate(bad)


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


@given(st.floats(min_value=0, max_value=1e12, allow_nan=False),
       st.sampled_from(["B/s", "KBps", "MB/s", "GBps", "GB/s", "kB/s", "GiB/s", "MiBps"]))
def test_bytes_per_second_format_as_bits_and_read_back(value: float, unit: str) -> None:
    """A rate written in bytes is shown in bits (format_rate) and that text reads back as
    the same rate."""
    bps = parse_rate(f"{value!r}{unit}")
    text = format_rate(bps)
    assert "bit" in text and parse_rate(text) == bps


@pytest.mark.parametrize(("text", "per_s"), [
    ("20/s", 20.0), ("1200/min", 20.0), ("1/5s", 0.2), ("1/500ms", 2.0), (20, 20.0),
    ("20", 20.0),
])
def test_counts_per_second(text: object, per_s: float) -> None:
    assert parse_per_second(text) == pytest.approx(per_s)


@pytest.mark.parametrize("bad", ["20/0s", "-1/s", "x/s", "20/hour", "20 rps", True])
def test_bad_counts_per_second(bad: object) -> None:
    with pytest.raises(ValueError, match="expected a count per time like '20/s'"):
        parse_per_second(bad)


@given(st.integers(min_value=0, max_value=2**40))
def test_size_round_trip(value: int) -> None:
    assert parse_size(format_size(value)) == value


@given(st.floats(min_value=0, max_value=1, allow_nan=False))
def test_fraction_round_trip(value: float) -> None:
    assert math.isclose(parse_fraction(format_fraction(value)), value, rel_tol=0, abs_tol=0)
