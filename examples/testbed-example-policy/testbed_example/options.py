"""Parsers for the policies' `-o key=value` settings: a bad value is refused with its
reason before any planning starts."""

from __future__ import annotations


def at_least_one(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be at least 1")
    return value


def non_negative_seconds(text: str) -> float:
    value = float(text)
    if value < 0:
        raise ValueError("must not be negative")
    return value


def schedule_choice(text: str) -> str:
    if text not in ("auto", "gpipe", "1f1b"):
        raise ValueError("auto, gpipe or 1f1b")
    return text
