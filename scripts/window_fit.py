#!/usr/bin/env python3
"""The flow model's window by bottleneck rate (testbed.plan.tcp_model.WINDOW_EFFICIENCY_BY_RATE)
fitted to the recorded emulator runs of `scripts/bench_peers.py --emulator windows`, so the
constants follow from the data.

A run's share is what its one connection delivered per round trip in its steady part (its
goodput times the round trip) over its send buffer. Per rate, the median share over the
runs; each rate's figure is WINDOW_EFFICIENCY (measured on its own, at 1 Gbit/s) times
that median's ratio to the 1 Gbit/s median of the same recording, so that a recording
sets how the share grows with the rate, not its level at 1 Gbit/s.

`.venv/bin/python scripts/window_fit.py benchmarks/peers-emulator.json` prints the fit.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from testbed.common.units import parse_rate
from testbed.plan.tcp_model import WINDOW_EFFICIENCY, window_efficiency
from testbed.topology.model import TcpSettings

DECIMALS = 2
"""What the fitted figures are rounded to: three runs per rate do not pin a closer."""
REFERENCE_BPS = 1e9


def share(run: dict[str, Any]) -> float:
    """Of its send buffer, what the run's connection delivered per round trip."""
    per_round_trip = run["steady_goodput_mbps"] * 1e6 / 8 * run["rtt_ms"] / 1e3
    return float(per_round_trip / TcpSettings().wmem[2])


def rows(recorded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rate, ascending: its runs' shares, their median, the fitted figure and the
    model's."""
    by_rate: dict[float, list[dict[str, Any]]] = {}
    for run in recorded:
        by_rate.setdefault(parse_rate(run["rate"]), []).append(run)
    if REFERENCE_BPS not in by_rate:
        return []
    reference = statistics.median(share(r) for r in by_rate[REFERENCE_BPS])
    out = []
    for rate, runs in sorted(by_rate.items()):
        shares = [share(r) for r in runs]
        median = statistics.median(shares)
        out.append({"rate_bps": rate, "rtt_ms": runs[0]["rtt_ms"], "shares": shares,
                    "median": median,
                    "fitted": round(WINDOW_EFFICIENCY * median / reference, DECIMALS),
                    "model": window_efficiency(rate),
                    "machine_bound_runs": sum(bool(r.get("machine_bound")) for r in runs)})
    return out


def fit_file(path: Path) -> tuple[tuple[float, float], ...]:
    recorded = json.loads(path.read_text()).get("windows", [])
    return tuple((row["rate_bps"], row["fitted"]) for row in rows(recorded))


if __name__ == "__main__":
    print(fit_file(Path(sys.argv[1])))
