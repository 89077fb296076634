"""What each WAN link carried over time, from the transfer spans both backends write.

A transfer span says how many bytes reached the receiver between its start and its end,
not how fast they went at each moment: transfers that share a link speed up and slow
down as others come and go. Spreading each transfer's bytes evenly over its span
therefore overstates the link where transfers overlap (two that shared a link for a
while, then one ran on alone, add up to more than the link's rate while both ran) and
understates it elsewhere. What is certain is that no link carried more than its rate at
any moment and that each transfer's bytes crossed within its own span. `carried` keeps
both: each transfer's bytes spread evenly over its span, and where overlapping spreads
add up to more than the rate, the two are fitted in turn (iterative proportional
fitting): every moment above the rate scaled down to it, every transfer scaled back up
to its bytes within its span, until no moment is above the rate. Transfers alone on a
link, or overlapping within its rate, stay evenly spread. A transfer routed through
another DC counts on each link it crosses.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from testbed.common.spans import Span

ROUNDS = 2000
"""Rounds of fitting, at most (the overlaps of real runs take tens); a link that carried
more than the rate it is held to never fits, and keeps what is left over."""
TOLERANCE = 1e-6
"""Relative excess over a link's rate left as it is (rounding)."""
SHORTEST_S = 1e-9
"""A transfer's span at least this long (one of length zero has no rate)."""
Floats = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LinkUse:
    """Each link direction's use over time in equal bins: the bins' middles (seconds
    since the run started) and, per direction, the share of its rate it carried in each."""

    times: list[float]
    utilization: dict[str, list[float]]


def routes(path: Mapping[tuple[str, str], Sequence[str]]) -> dict[str, tuple[str, ...]]:
    """For each `src>dst` a transfer names, the link directions its bytes cross: the
    pairs of consecutive DCs along `path[(src, dst)]` (the topology's route)."""
    return {f"{src}>{dst}": tuple(f"{a}>{b}" for a, b in itertools.pairwise(hops))
            for (src, dst), hops in path.items()}


def link_transfers(spans: Iterable[Span], route: Mapping[str, Sequence[str]],
                   origin: float = 0.0) -> dict[str, list[tuple[float, float, float]]]:
    """Per link direction, the (start, end, bytes) of the transfers that crossed it, in
    seconds since `origin`."""
    out: dict[str, list[tuple[float, float, float]]] = {}
    for span in spans:
        link = span.get("link")
        if span["kind"] != "transfer" or not link:
            continue
        for hop in route.get(link, (link,)):
            out.setdefault(hop, []).append(
                (span["start"] - origin,
                 max(span["end"] - origin, span["start"] - origin + SHORTEST_S),
                 float(span.get("bytes", 0))))
    return out


def carried(transfers: Sequence[tuple[float, float, float]], rate_bps: float
            ) -> tuple[Floats, Floats]:
    """What one link direction of `rate_bps` carried over time (the module's docstring
    says how): the times at which any of its transfers started or ended, and the bytes it
    carried, at an even rate, between each two of them."""
    transfers = [t for t in transfers if t[2] > 0]  # a zero-byte one carries nothing
    if not transfers:
        return np.zeros(1), np.zeros(0)
    starts = np.array([t[0] for t in transfers])
    ends = np.array([t[1] for t in transfers])
    edges = np.unique(np.concatenate([starts, ends]))
    lengths = np.diff(edges)
    # each transfer's share of each interval it covers, as flat (row, col, bytes) entries
    first = np.searchsorted(edges, starts)
    count = np.searchsorted(edges, ends) - first
    row = np.repeat(np.arange(len(transfers)), count)
    col = np.repeat(first - np.cumsum(count) + count, count) + np.arange(count.sum())
    nbytes = np.array([t[2] for t in transfers])
    share = (nbytes / (ends - starts))[row] * lengths[col]
    room = rate_bps / 8 * lengths
    for _ in range(ROUNDS if rate_bps > 0 else 0):
        load = np.bincount(col, share, len(lengths))
        over = load > room * (1 + TOLERANCE)
        if not over.any():
            break
        share *= np.where(over, room / np.where(over, load, 1.0), 1.0)[col]
        share *= (nbytes / np.bincount(row, share, len(transfers)))[row]
    return edges, np.bincount(col, share, len(lengths)).astype(np.float64)


def binned(edges: Floats, carried_bytes: Floats, start: float, end: float, bins: int
           ) -> Floats:
    """Bytes per bin of `bins` equal bins from `start` to `end` (a rate is even between
    two edges, so the bytes up to any time are a straight line between them)."""
    upto = np.concatenate([[0.0], np.cumsum(carried_bytes)])
    return np.diff(np.interp(np.linspace(start, end, bins + 1), edges, upto))


def link_use(spans: Iterable[Span], start: float, end: float, rates: Mapping[str, float],
             route: Mapping[str, Sequence[str]] | None = None,
             peaks: Mapping[str, float] | None = None, bins: int = 200) -> LinkUse:
    """Each link direction's use from `start` to `end` in `bins` bins, as a share of its
    rate in `rates` (bit/s; 0 where a direction has none). `peaks`: the highest rate a
    direction had during the run where events raised it above `rates` (the bound its
    transfers are kept within)."""
    width = (end - start) / bins
    use: dict[str, list[float]] = {}
    for link, transfers in sorted(link_transfers(spans, route or {}, start).items()):
        rate = rates.get(link, 0.0)
        edges, nbytes = carried(transfers, max(rate, (peaks or {}).get(link, 0.0)))
        per_bin = binned(edges, nbytes, 0.0, end - start, bins)
        use[link] = [float(b) * 8 / (rate * width) if rate else 0.0 for b in per_bin]
    return LinkUse([(i + 0.5) * width for i in range(bins)], use)
