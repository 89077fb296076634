"""`testbed up --plan`: the emulator runs a saved, hand-edited plan as written. Needs root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_given_plan import TWO_DC, compute_order, edit_gpu, saved_plan

pytestmark = [pytest.mark.root, pytest.mark.usefixtures("clean_host")]
ROOT = Path(__file__).resolve().parent.parent


def test_up_runs_a_hand_edited_plan(tmp_path: Path) -> None:
    edited = edit_gpu(saved_plan(tmp_path, "-p", "1f1b"), "east-0", ("0B0", "0F2"))
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-c", "from testbed.cli.main import main; main()", "up", TWO_DC,
         "--plan", str(edited), "--compute", "emulated", "--iterations", "2",
         "--out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "ok" and results["backend"] == "emulate"
    assert results["plan_file"] == str(edited) and results["policy"] == "1f1b"
    spans = json.loads((out / "spans.json").read_text())["spans"]
    assert compute_order(spans, "east-0")[:4] == ["0F0", "0F1", "0F2", "0B0"]
    assert compute_order(spans, "east-1")[:4] == ["0F0", "0F1", "0B0", "0F2"]
