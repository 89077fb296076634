#!/usr/bin/env python3
"""The paper's claims in both columns: `testbed figures` in the simulator, then over the
emulated WAN into the same directory (root; about an hour on 2 cores), then claims.json,
figures.md and the PNGs copied to benchmarks/claims/ and the table of docs/claims.md
rewritten from them (as scripts/docs_tables.py does). With --simulate-only the simulated
column and the search are measured again and the emulated column is kept from
benchmarks/claims/claims.json (`testbed figures` merges a backend into the records it finds).

`.venv/bin/python scripts/bench_claims.py [--out runs/figures-claims] [--simulate-only]`
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
os.environ["TESTBED_PLANNING_STORE"] = "off"  # every search timed as a first: none read back
KEEP = ("claims.json", "figures.md")


def figures(backend: str, out: Path) -> float:
    started = time.monotonic()
    command = [str(Path(sys.executable).parent / "testbed"), "figures", "--backend", backend,
               "--out", str(out)]
    subprocess.run(command, cwd=ROOT, check=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=Path("runs/figures-claims"))
    parser.add_argument("--simulate-only", action="store_true")
    args = parser.parse_args()
    out = args.out if args.out.is_absolute() else ROOT / args.out
    keep = ROOT / "benchmarks" / "claims"
    if out.exists():
        shutil.rmtree(out)
    if args.simulate_only and (keep / "claims.json").exists():
        out.mkdir(parents=True)  # `testbed figures` keeps the other backend's column
        shutil.copy2(keep / "claims.json", out / "claims.json")
    took = {"simulate": figures("simulate", out)}
    if not args.simulate_only:
        took["emulate"] = figures("emulate", out)
    if keep.exists():
        shutil.rmtree(keep)
    keep.mkdir(parents=True)
    for path in [*(out / name for name in KEEP), *sorted(out.glob("*.png")),
                 *sorted(out.glob("*.csv"))]:
        shutil.copy2(path, keep / path.name)
    from docs_tables import DOCS, render_into

    render_into(DOCS / "claims.md", "paper-claims")
    print(" ".join(f"{backend} {seconds:.0f} s" for backend, seconds in took.items()))


if __name__ == "__main__":
    main()
