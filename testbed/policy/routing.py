"""`-p POLICY[:LABEL]` and `-o [OWNER.]KEY=VALUE` for commands that run several policies
(compare, sweep). A label makes a variant of a policy, so one table holds the same policy
with two option sets (`-p diloco:h10 -p diloco:h100`); its row and run directory are named
by it. An option prefixed with a variant's label goes to that variant only, one prefixed
with a policy's name to every variant of it, an unprefixed one to every training policy;
the more specific wins. Bubble policies take only options prefixed with their name."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from testbed.errors import InputError, did_you_mean

LABEL = re.compile(r"[A-Za-z0-9_-]+")
"""What a label may hold: nothing that `-o` (`.`), a combination (`+`) or another label
(`:`) would read as a separator."""


@dataclass(frozen=True)
class Variant:
    """A training policy as `-p` names it: `policy` alone, or a labelled variant
    `policy:label`; `name` is how it was given, what its row is called."""

    policy: str
    name: str


def variants(names: Sequence[str], flag: str = "--policy") -> list[Variant]:
    """`-p` as variants; a bad label, or the same one twice, is a one-line InputError."""
    out: list[Variant] = []
    for name in names:
        policy, colon, label = name.partition(":")
        if colon and not (policy and LABEL.fullmatch(label)):
            raise InputError(f"{name!r}: expected POLICY:LABEL, a label of letters, digits, "
                             "- and _ (it names the row and its -o options)", flag)
        if name in (v.name for v in out):
            hint = "" if colon else f" (to run it with two option sets, label each: " \
                f"-p {policy}:a -p {policy}:b)"
            raise InputError(f"{name} is given twice{hint}", flag)
        out.append(Variant(policy, name))
    return out


def options_for(name: str, pairs: Sequence[str], unprefixed: bool = True,
                label: str | None = None) -> dict[str, str]:
    """The options of policy `name` among `pairs` (`unprefixed`: a training policy, which
    also takes the options given to all; `label`: a variant's, which also takes those
    addressed to it, over those to its policy and to all)."""
    tiers: tuple[dict[str, str], dict[str, str], dict[str, str]] = ({}, {}, {})
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InputError(f"expected [POLICY.]KEY=VALUE, got {pair!r}", "--option")
        owner, dot, option = key.partition(".")
        if dot and label is not None and owner == label:
            tiers[2][option] = value
        elif dot and owner == name:
            tiers[1][option] = value
        elif not dot and unprefixed:
            tiers[0][key] = value
    return {**tiers[0], **tiers[1], **tiers[2]}


def check_owners(pairs: Sequence[str], chosen: Sequence[str], flag: str = "--option") -> None:
    """`-o gpip.connections=2`: an option for a policy (or label) that does not run
    here."""
    for pair in pairs:
        owner, dot, _ = pair.partition("=")[0].partition(".")
        if dot and owner not in chosen:
            raise InputError(f"{pair!r} is for {owner!r}, which is not compared here"
                             f"{did_you_mean(owner, chosen)}", flag)
