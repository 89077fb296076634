#!/usr/bin/env python3
"""The flow model's RTT bias (testbed.plan.tcp_model.RTT_BIAS) fitted to recorded emulator
share runs, so the constants follow from the data, not from a hand's tuning.

Per congestion control and pacing, the exponent a is the least-squares fit of
log(simulated / measured median) over every flow of that control's share cases, two and
eight flows together. The simulated share is the simulator's own sharing once every
window is open: its weights (Pair.weight at RTT bias a) and weighted max-min (max_min)
over the bottleneck at its payload capacity, each flow capped at its window per round
trip: what testbed.sim.one_transfer.shared_rates settles at (tests/test_tcp_model.py
holds the two to each other on the recorded cases).

`.venv/bin/python scripts/rtt_bias_fit.py benchmarks/peers-emulator.json` prints the fit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from peer_cases import ShareCase, share_topology

from testbed.plan.tcp_model import PAYLOAD_EFFICIENCY
from testbed.sim.flows import Pair, pair_between
from testbed.sim.max_min import max_min

DECIMALS = 2
"""What the fitted exponents are rounded to: five runs' medians do not pin a closer."""
LOW, HIGH, STEP = -1.0, 3.0, 0.01
"""Where the exponent is searched: a grid over it, then a golden section about the best."""
BOTTLENECK = "hub>dst"


@dataclass(frozen=True)
class MeasuredShares:
    """One recorded share case: each flow's median rate over its runs (Mbit/s)."""

    case: ShareCase
    medians_mbps: tuple[float, ...]


def measured(entries: list[dict[str, Any]]) -> list[MeasuredShares]:
    """The `shares` part of a recorded emulator file (scripts/bench_peers.py --emulator)."""
    out = []
    for entry in entries:
        case = ShareCase.from_recorded(entry)
        runs = [run["mbps"] for run in entry["runs"]]
        out.append(MeasuredShares(case, tuple(statistics.median(run[i] for run in runs)
                                              for i in range(len(case.rtts_ms)))))
    return out


def pairs_of(case: ShareCase) -> tuple[list[Pair], float]:
    """Each flow's connection as the simulator makes it, and the bottleneck's payload
    capacity (bit/s)."""
    topology = share_topology(case)
    pairs = [pair_between(topology, f"s{i}", "dst", 1,
                          2 * topology.one_way_latency(f"s{i}", "dst"), math.inf, 0.0,
                          case.paced) for i in range(len(case.rtts_ms))]
    return pairs, topology.link("hub", "dst").bandwidth_bps * PAYLOAD_EFFICIENCY


def steady_shares(pairs: list[Pair], capacity_bps: float, bias: float) -> list[float]:
    """bit/s each pair's flow gets of the bottleneck with every window open, its weight
    at RTT bias `bias`."""
    flows: dict[int, tuple[float, float, tuple[str, ...]]] = {}
    for i, pair in enumerate(pairs):
        biased = dataclasses.replace(pair, rtt_bias=bias)
        flows[i] = (biased.weight(), biased.steady_cap(), (BOTTLENECK,))
    rates = max_min(flows, {BOTTLENECK: capacity_bps})
    return [rates[i] for i in range(len(pairs))]


def _minimise(f: Callable[[float], float]) -> float:
    grid = [LOW + i * STEP for i in range(round((HIGH - LOW) / STEP) + 1)]
    best = min(grid, key=f)
    a, b = max(LOW, best - STEP), min(HIGH, best + STEP)
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        c, d = b - ratio * (b - a), a + ratio * (b - a)
        if f(c) <= f(d):
            b = d
        else:
            a = c
    return (a + b) / 2


def fit_rtt_bias(recorded: list[MeasuredShares]) -> dict[tuple[str, bool], float]:
    """(congestion, paced) -> the exponent a that fits its recorded cases best, rounded."""
    groups: dict[tuple[str, bool], list[tuple[list[Pair], float, tuple[float, ...]]]] = {}
    for shares in recorded:
        key = (shares.case.congestion, shares.case.paced)
        groups.setdefault(key, []).append((*pairs_of(shares.case), shares.medians_mbps))
    out = {}
    for key, cases in groups.items():
        def squared_error(bias: float, cases: list[tuple[list[Pair], float, tuple[float, ...]]]
                          = cases) -> float:
            return sum(math.log(rate / 1e6 / median) ** 2
                       for pairs, capacity, medians in cases
                       for rate, median in zip(steady_shares(pairs, capacity, bias), medians,
                                               strict=True))
        out[key] = round(_minimise(squared_error), DECIMALS)
    return out


def fit_file(path: Path) -> dict[tuple[str, bool], float]:
    return fit_rtt_bias(measured(json.loads(path.read_text())["shares"]))


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: rtt_bias_fit.py RECORDED.json (scripts/bench_peers.py --emulator shares)",
              file=sys.stderr)
        return 2
    try:
        fitted = fit_file(Path(argv[0]))
    except (OSError, ValueError, KeyError, TypeError, IndexError) as error:
        print(f"{argv[0]}: no share runs to fit ({type(error).__name__}: {error})",
              file=sys.stderr)
        return 2
    for (congestion, paced), bias in fitted.items():
        print(f"({congestion!r}, {paced}): {bias},")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
