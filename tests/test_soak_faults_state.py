"""The probing script for a run's state files and a sweep's life (scripts/soak_faults_state.py),
run as a benchmark: a short pass finds no hole."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.benchmark
def test_a_short_pass_of_the_state_and_sweep_faults_finds_no_hole(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "soak_faults_state.py"),
                           "--quick", "--out", str(out)], capture_output=True, text=True,
                          timeout=1800, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    parts = [p for p in report.values() if isinstance(p, dict) and "failures" in p]
    assert len(parts) >= 5 and not any(p["failures"] for p in parts)
    assert "refused" in done.stdout and report["long_trace"]["exit"] == 2
