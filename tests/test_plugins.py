"""A plugin installed from its own folder is found; a broken one breaks nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TWO_DC = Path(__file__).parent.parent / "topologies" / "two-dc.yaml"


def _testbed(args: list[str], extra_path: Path | None) -> subprocess.CompletedProcess[str]:
    return run_testbed(args, extra_path)


def run_testbed(args: list[str], extra_path: Path | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(extra_path), env.get("PYTHONPATH", "")])
        )
    return subprocess.run(
        [sys.executable, "-c", "from testbed.cli import main; main()", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_builtins_are_listed_with_their_distribution() -> None:
    result = _testbed(["plugins", "--json"], None)
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    for name in ("gpipe", "1f1b", "dp-across-dc"):
        assert rows[name]["distribution"] == "testbed"
        assert rows[name]["status"] == "ok"


def test_outside_plugin_is_found_and_used(plugin_path: Path) -> None:
    result = _testbed(["plugins", "--json"], plugin_path)
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["reverse-gpipe"]["distribution"] == "sample-policies"
    assert rows["reverse-gpipe"]["options"]["connections"]["default"] == 1
    assert rows["never"]["kind"] == "bubble"
    assert rows["broken"]["status"].startswith("broken: ModuleNotFoundError")
    result = _testbed(
        ["plan", str(TWO_DC), "-p", "reverse-gpipe", "-o", "connections=3"], plugin_path
    )
    assert result.returncode == 0, result.stderr
    assert "west-1" in result.stdout.splitlines()[1].split()[0]
    assert "TCP connections per peer pair: 3" in result.stdout


def test_broken_plugin_breaks_nothing_else(plugin_path: Path) -> None:
    ok = _testbed(["plan", str(TWO_DC), "-p", "gpipe"], plugin_path)
    assert ok.returncode == 0, ok.stderr
    broken = _testbed(["plan", str(TWO_DC), "-p", "broken"], plugin_path)
    assert broken.returncode == 1
    assert broken.stderr.strip().startswith(
        "testbed: error: training policy 'broken' from "
        "sample-policies is broken: ModuleNotFoundError"
    )
    assert "Traceback" not in broken.stderr
    failing = _testbed(["plan", str(TWO_DC), "-p", "failing"], plugin_path)
    assert failing.returncode == 1
    assert "failing" in failing.stderr and "Traceback" not in failing.stderr


def test_unknown_policy_and_option() -> None:
    result = _testbed(["plan", str(TWO_DC), "-p", "nope"], None)
    assert result.returncode == 2
    assert "unknown training policy 'nope'" in result.stderr
    result = _testbed(["plan", str(TWO_DC), "-p", "gpipe", "-o", "x=1"], None)
    assert result.returncode == 2
    assert "unknown option 'x' for gpipe" in result.stderr


def test_an_ablation_lists_what_it_pins_and_refuses_it_as_an_option() -> None:
    result = _testbed(["plugins", "--json"], None)
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["atlas-no-temporal"]["fixed"] == {"temporal": False}
    assert "temporal" not in rows["atlas-no-temporal"]["options"]
    assert rows["atlas-no-multiconn"]["fixed"] == {"connections": 1}
    assert "connections" not in rows["atlas-no-multiconn"]["options"]
    assert rows["atlas-no-selection"]["fixed"] == {"selection": False}
    assert rows["atlas"]["fixed"] == {} and rows["atlas"]["options"]["temporal"]["default"]
    text = _testbed(["plugins"], None).stdout
    assert "temporal=False" in text and "fixed by this policy" in text
    refused = _testbed(["plan", str(TWO_DC), "-p", "atlas-no-temporal", "-o", "temporal=on"],
                       None)
    assert refused.returncode == 2 and "unknown option 'temporal'" in refused.stderr
