"""What the command loads: a simulation or the help never pays for torch, matplotlib or
the emulator's runtime, which only `up`, plots and real compute need."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "matplotlib", "numpy", "pyroute2", "uvloop")
EMULATOR = ("testbed.emulator.backend", "testbed.emulator.runtime.coordinator.coordinator",
            "testbed.emulator.runtime.worker.process", "testbed.emulator.net.network")

LOADED = """
import json, sys
from testbed.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit as exc:
    assert not exc.code, exc.code
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(*args: str) -> set[str]:
    """The modules a `testbed ARGS` command left loaded, run in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", LOADED, *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.parametrize("args", [("--help",), ("simulate", "--help")])
def test_help_loads_no_heavy_module(args: tuple[str, ...]) -> None:
    loaded = _loaded(*args)
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}
    assert not loaded & set(EMULATOR)


def test_simulate_loads_no_heavy_module(tmp_path: Path) -> None:
    loaded = _loaded("simulate", str(ROOT / "topologies" / "paper-3dc.yaml"), "-p", "gpipe",
                     "--iterations", "2", "--out", str(tmp_path / "run"))
    assert (tmp_path / "run" / "results.json").exists()
    assert "testbed.sim.simulator" in loaded  # it did simulate
    assert not {m for m in loaded if m.split(".")[0] in HEAVY}
    assert not loaded & set(EMULATOR)
