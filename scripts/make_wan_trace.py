#!/usr/bin/env python3
"""Write scenarios/wan-trace.csv: a synthetic trace in the shape of one-second iperf3
samples of a shared inter-region link (seeded, so the file is reproducible). It is not a
measurement: it has what measured WAN traces show, a rate below the link's capacity
that wanders by about 10% from second to second, and cross traffic that takes 50-80% of
it for a few seconds now and then, with queueing that adds a few milliseconds of delay.

`.venv/bin/python scripts/make_wan_trace.py [--seconds 300] [--capacity-mbit 1000]
[--base-latency-ms 20] [--seed 7] [--out scenarios/wan-trace.csv]`
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def samples(seconds: int, capacity_mbit: float, base_ms: float, seed: int
            ) -> list[tuple[int, float, float]]:
    rng = random.Random(seed)
    level, burst_left, burst_share = 0.85, 0, 0.0
    out = []
    for t in range(seconds):
        level += 0.3 * (0.85 - level) + rng.gauss(0.0, 0.06)  # wanders, reverts
        level = min(0.97, max(0.6, level))
        if burst_left == 0 and rng.random() < 0.05:  # cross traffic, every 20 s or so
            burst_left, burst_share = rng.randint(3, 8), rng.uniform(0.5, 0.8)
        share = burst_share if burst_left else 0.0
        burst_left = max(0, burst_left - 1)
        rate = capacity_mbit * level * (1 - share)
        latency = base_ms + (share * 6 + abs(rng.gauss(0.0, 0.3)))  # queueing
        out.append((t, round(rate, 1), round(latency, 2)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=int, default=300)
    parser.add_argument("--capacity-mbit", type=float, default=1000.0)
    parser.add_argument("--base-latency-ms", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, default=ROOT / "scenarios" / "wan-trace.csv")
    args = parser.parse_args()
    lines = ["# synthetic, measured-style: scripts/make_wan_trace.py "
             f"--seconds {args.seconds} --capacity-mbit {args.capacity_mbit:g} "
             f"--base-latency-ms {args.base_latency_ms:g} --seed {args.seed}",
             "time_s,bandwidth,latency"]
    lines += [f"{t},{rate:g}Mbit,{latency:g}ms"
              for t, rate, latency in samples(args.seconds, args.capacity_mbit,
                                              args.base_latency_ms, args.seed)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
