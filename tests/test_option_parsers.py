"""The policy API's option parsers accept what their names say and refuse the rest with a
reason a user can act on."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from testbed.policy.api import (
    at_least_one,
    fraction,
    non_negative,
    non_negative_int,
    on_off,
    one_of,
)


@pytest.mark.parametrize(("parse", "text", "value"), [
    (at_least_one, "1", 1), (non_negative_int, "0", 0), (non_negative, "0.5", 0.5),
    (fraction, "0", 0.0), (fraction, "0.99", 0.99), (on_off, "ON", True), (on_off, "no", False),
    (one_of("a", "b"), "b", "b"),
])
def test_good_values(parse: Callable[[str], Any], text: str, value: Any) -> None:
    assert parse(text) == value


@pytest.mark.parametrize(("parse", "text", "reason"), [
    (at_least_one, "0", "at least 1"), (at_least_one, "x", "invalid literal"),
    (non_negative_int, "-1", "negative"), (non_negative, "-0.1", "negative"),
    (non_negative, "nan", "negative"), (fraction, "1", "fraction"),
    (on_off, "maybe", "on or off"), (one_of("a", "b"), "c", "one of a, b"),
])
def test_bad_values_say_why(parse: Callable[[str], Any], text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse(text)
