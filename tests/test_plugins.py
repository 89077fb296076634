"""A plugin installed from its own folder is found; a broken one breaks nothing else."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from testbed.errors import PluginError
from testbed.policy import api, registry
from testbed.policy.api import API_VERSION, Job, Plan, PlanningContext, Topology, TrainingPolicy
from testbed.policy.registry import TRAINING_GROUP, discover, training_policy

ROOT = Path(__file__).parent.parent
TWO_DC = ROOT / "topologies" / "two-dc.yaml"


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


class Outdated(TrainingPolicy):
    """A plugin written for another version of the policy API."""

    name = "outdated"
    api_version = API_VERSION + 1

    def plan(self, topology: Topology, job: Job, context: PlanningContext) -> Plan:
        raise AssertionError("never asked")


@dataclass
class _Dist:
    name: str


@dataclass
class _Unloadable:
    """Entry-point metadata whose code must not be imported."""

    name: str
    value: str
    dist: _Dist

    def load(self) -> Any:
        raise AssertionError(f"{self.name} from {self.dist.name} was imported")


def _registered(monkeypatch: pytest.MonkeyPatch, *entries: Any) -> None:
    monkeypatch.setattr(registry, "entry_points",
                        lambda group: list(entries) if group == TRAINING_GROUP else [])


def test_a_plugin_for_another_api_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    _registered(monkeypatch, EntryPoint("outdated", f"{__name__}:Outdated", TRAINING_GROUP))
    expected = (f"written for policy API version {API_VERSION + 1}, this testbed supports "
                f"version {API_VERSION}")
    assert discover(TRAINING_GROUP)["outdated"].error == expected
    with pytest.raises(PluginError) as refused:
        training_policy("outdated")
    assert str(refused.value) == f"training policy 'outdated' from unknown is broken: {expected}"


def test_a_name_two_distributions_claim_is_refused_without_importing_either(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _registered(monkeypatch, _Unloadable("twice", "a:A", _Dist("first")),
                _Unloadable("twice", "b:B", _Dist("second")))
    assert discover(TRAINING_GROUP)["twice"].error == "registered by both first and second"
    with pytest.raises(PluginError, match="registered by both first and second"):
        training_policy("twice")


def test_choosing_a_policy_imports_no_other_plugin() -> None:
    script = (
        "import sys\n"
        "from testbed.cli import main\n"
        f"main(['plan', {str(TWO_DC)!r}, '-p', 'gpipe'])\n"
        "print(sorted(m for m in sys.modules if m.startswith('testbed_plugins')))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = ast.literal_eval(result.stdout.splitlines()[-1])
    assert "testbed_plugins.baselines.pipeline" in loaded
    assert not [m for m in loaded if m.startswith(("testbed_plugins.atlas",
                                                   "testbed_plugins.bubbletea"))], loaded


def test_the_api_exports_what_it_lists() -> None:
    assert isinstance(api.API_VERSION, int)
    assert all(hasattr(api, name) for name in api.__all__)
    assert {"build_plan", "Schedule", "LinkKind", "PlanningContext", "TrainingPolicy",
            "BubblePolicy", "Plan", "Topology", "Job", "InputError"} <= set(api.__all__)
