"""Why Atlas's plan search chose what it chose, in words for the plan's notes."""

from __future__ import annotations

from collections.abc import Sequence

from .search import Candidate


def why_chosen(ranked: Sequence[Candidate], pool: int, selection: bool, mode: str) -> str:
    """Why the winner won, in words: what was measured, and each mechanism's verdict."""
    best = ranked[0]
    how = ("every one with every mechanism" if mode == "exhaustive" else
           "every one" if mode == "grid" else
           "the best ones and the best on each DC subset, their neighbours in dp and pp, "
           "and every schedule and mechanism of the leaders")
    words = [f"fastest of {len(ranked)} simulated plans (of {pool} placements and schedules "
             f"ranked by the closed form: {how})"]
    if not selection:
        words.insert(0, "selection off: every DC, largest first")
    same = [c for c in ranked if c.placement_key == best.placement_key
            and c.simulated_s is not None]
    if best.simulated_s is not None:
        other = [c for c in same if c.temporal != best.temporal]
        if other:
            alt = min(other, key=lambda c: c.seconds)
            mode = "temporal sharing" if best.temporal else "fair sharing"
            verb = "on" if best.temporal else "off"
            if abs(alt.seconds - best.seconds) <= 1e-9 * best.seconds:
                words.append(f"temporal sharing {verb}: the same {best.seconds:.4g} s either "
                             "way (nothing else competes for the link)")
            else:
                words.append(f"temporal sharing {verb}: {mode} {best.seconds:.4g} s against "
                             f"{_seconds(alt)} {'fair' if best.temporal else 'temporal'}")
        if best.temporal:
            cells = [c for c in same if c.temporal and c.cell != best.cell]
            if cells:
                fastest = min(cells, key=lambda c: c.seconds)
                words.append(f"DP-cells of {best.cell or best.dp} replicas (other sizes "
                             f"{_seconds(fastest, 3)} at best)")
    return "; ".join(words)


def _seconds(candidate: Candidate, digits: int = 4) -> str:
    """A simulated time in words: "at least" where the simulation stopped early."""
    text = f"{candidate.seconds:.{digits}g} s"
    return f"at least {text}" if candidate.at_least else text
