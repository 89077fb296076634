"""`-o [POLICY.]KEY=VALUE` for commands that run several policies (compare, sweep): an
option prefixed with a policy's name goes to that policy only, an unprefixed one to every
training policy; bubble policies take only options prefixed with their name."""

from __future__ import annotations

from collections.abc import Sequence

from testbed.errors import InputError, did_you_mean


def options_for(name: str, pairs: Sequence[str], unprefixed: bool = True) -> dict[str, str]:
    """The options of policy `name` among `pairs` (`unprefixed`: a training policy, which
    also takes the options given to all)."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise InputError(f"expected [POLICY.]KEY=VALUE, got {pair!r}", "--option")
        owner, dot, option = key.partition(".")
        if dot and owner == name:
            out[option] = value
        elif not dot and unprefixed:
            out[key] = value
    return out


def check_owners(pairs: Sequence[str], chosen: Sequence[str], flag: str = "--option") -> None:
    """`-o gpip.connections=2`: an option for a policy that does not run here."""
    for pair in pairs:
        owner, dot, _ = pair.partition("=")[0].partition(".")
        if dot and owner not in chosen:
            raise InputError(f"{pair!r} is for {owner!r}, which is not compared here"
                             f"{did_you_mean(owner, chosen)}", flag)
