"""A plugin installed from its own folder is found; a broken one breaks nothing else."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from enum import Enum
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any, Literal, get_origin, get_type_hints

import pytest

from testbed import DISTRIBUTION
from testbed.errors import PluginError
from testbed.policy import api, registry
from testbed.policy.api import API_VERSION, Job, Plan, PlanningContext, Topology, TrainingPolicy
from testbed.policy.base import NoSettings
from testbed.policy.option_parsers import option_text
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
        [sys.executable, "-c", "from testbed.cli.main import main; main()", *args],
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
        assert rows[name]["distribution"] == DISTRIBUTION
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
    assert rows["atlas-no-multiconn"]["fixed"] == {"connections": 1, "max_connections": 0}
    assert "connections" not in rows["atlas-no-multiconn"]["options"]
    assert rows["atlas-no-selection"]["fixed"] == {"selection": False}
    assert rows["atlas"]["fixed"] == {} and rows["atlas"]["options"]["temporal"]["default"]
    text = _testbed(["plugins"], None).stdout
    assert "temporal=off" in text and "fixed by this policy" in text
    assert "-o temporal=on " in text and "True" not in text and "False" not in text
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
        "from testbed.cli.main import main\n"
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
    # what a policy reads besides: the parts of a topology and a job, a bubble's requests
    assert {"Datacenter", "WanLink", "Gpu", "GpuType", "TcpSettings", "ModelShape",
            "Request"} <= set(api.__all__)


def _undocumented(cls: type) -> list[str]:
    """Public fields, enum members, class attributes and methods of `cls` (as its source
    defines them) without a docstring: an attribute's is the string right after it."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    missing = []
    for k, node in enumerate(body):
        after = body[k + 1] if k + 1 < len(body) else None
        described = isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
            and isinstance(after.value.value, str)
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            missing += [name for name in names if not name.startswith("_") and not described]
        elif isinstance(node, ast.FunctionDef) and not node.name.startswith("_") \
                and ast.get_docstring(node) is None:
            missing.append(f"{node.name}()")
    return missing


def test_the_sdk_reference_documents_every_name_field_and_method() -> None:
    """docs/sdk.md is rendered from these docstrings, and mkdocstrings leaves out a member
    that has none: a plugin's author reads there what `topology.datacenters`, `job.tp` or
    `request.arrival` are, and what each helper does."""
    missing = {}
    for name in api.__all__:
        value = getattr(api, name)
        if inspect.isclass(value):
            found = _undocumented(value)
            if value.__doc__ is None or (issubclass(value, Enum) and "__doc__" not in vars(value)):
                found.insert(0, "(class)")
        elif inspect.isfunction(value):
            found = [] if inspect.getdoc(value) else ["(function)"]
        else:
            continue
        if found:
            missing[name] = found
    assert missing == {}


# Plugin code that ends, interrupts or crashes the command (tests/fixtures/hostile_plugin).

def _hostile_file(hostile: Path, module: str = "__init__") -> Path:
    return hostile / "hostile_policies" / f"{module}.py"


def _line_of(path: Path, text: str) -> int:
    return next(n for n, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_plugin_crash_names_the_plugin_file_and_line(hostile_plugin_path: Path) -> None:
    """The innermost frame in the plugin's package: here a helper `plan` calls."""
    result = _testbed(["plan", str(TWO_DC), "-p", "oops"], hostile_plugin_path)
    source = _hostile_file(hostile_plugin_path)
    line = _line_of(source, "return table[key]")
    assert result.returncode == 1
    assert result.stderr == ("testbed: error: policy 'oops' failed while planning: "
                             f"KeyError: 'oops' (at {source}:{line})\n")


@pytest.mark.parametrize("how", [["--debug"], []])
def test_debug_shows_the_whole_traceback(hostile_plugin_path: Path, how: list[str]) -> None:
    env = dict(os.environ, TESTBED_DEBUG="1") if not how else dict(os.environ)
    env["PYTHONPATH"] = str(hostile_plugin_path)
    result = subprocess.run([sys.executable, "-c", "from testbed.cli.main import main; main()",
                             *how, "plan", str(TWO_DC), "-p", "oops"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert "KeyError: 'oops'" in lines
    assert "The above exception was the direct cause of the following exception:" in lines
    assert lines[-1].startswith("testbed: error: policy 'oops' failed while planning")
    plain = _testbed(["plan", str(TWO_DC), "-p", "oops"], hostile_plugin_path)
    assert "Traceback" not in plain.stderr


def test_the_python_api_keeps_the_plugins_exception(hostile_plugin_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed import api as testbed_api

    monkeypatch.syspath_prepend(str(hostile_plugin_path))
    inputs = testbed_api.load(TWO_DC)
    with pytest.raises(PluginError, match=r"KeyError: 'oops' \(at .*__init__.py:\d+\)") as caught:
        testbed_api.plan(inputs, "oops")
    assert isinstance(caught.value.__cause__, KeyError)


@pytest.mark.parametrize(("policy", "expected"), [
    ("exits", "policy 'exits' failed while planning: SystemExit: 0 (at {init}:{exit})"),
    ("interrupts", "policy 'interrupts' failed while planning: KeyboardInterrupt "
                   "(at {init}:{interrupt})"),
    ("exits-on-import", "training policy 'exits-on-import' from hostile-policies is broken: "
                        "SystemExit: 0 (at {on_import}:3)"),
    ("interrupts-on-import", "training policy 'interrupts-on-import' from hostile-policies is "
                             "broken: KeyboardInterrupt (at {interrupts}:1)"),
])
def test_a_plugins_exit_or_interrupt_is_its_error(hostile_plugin_path: Path, policy: str,
                                                  expected: str) -> None:
    """Not exit status 0 and silence (SystemExit), nor 130 (a KeyboardInterrupt that no
    Ctrl-C sent): exit 1, naming the plugin and the line."""
    init = _hostile_file(hostile_plugin_path)
    places = {"init": init, "exit": _line_of(init, "sys.exit(0)"),
              "interrupt": _line_of(init, "raise KeyboardInterrupt"),
              "on_import": _hostile_file(hostile_plugin_path, "exits_on_import"),
              "interrupts": _hostile_file(hostile_plugin_path, "interrupts_on_import")}
    result = _testbed(["plan", str(TWO_DC), "-p", policy], hostile_plugin_path)
    assert (result.returncode, result.stderr) == (
        1, f"testbed: error: {expected.format(**places)}\n")


def test_plugins_lists_a_plugin_that_exits_on_import_and_every_other(
        hostile_plugin_path: Path) -> None:
    result = _testbed(["plugins", "--json"], hostile_plugin_path)
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["exits-on-import"]["status"].startswith("broken: SystemExit: 0 (at ")
    assert rows["interrupts-on-import"]["status"].startswith("broken: KeyboardInterrupt (at ")
    assert rows["gpipe"]["status"] == rows["oops"]["status"] == "ok"
    text = _testbed(["plugins"], hostile_plugin_path)
    assert text.returncode == 0 and "gpipe" in text.stdout and "exits-on-import" in text.stdout


def test_a_plugins_exit_in_a_hook_fails_the_run(hostile_plugin_path: Path,
                                                tmp_path: Path) -> None:
    paper = ROOT / "topologies" / "paper-3dc.yaml"
    result = _testbed(["simulate", str(paper), "-p", "1f1b", "--pp", "4", "-b", "exits-in-admit",
                       "--out", str(tmp_path / "a")], hostile_plugin_path)
    assert result.returncode == 1
    assert "bubble policy 'exits-in-admit' failed in admit: SystemExit (at " in result.stderr
    result = _testbed(["simulate", str(TWO_DC), "-p", "exits-in-next-transfer",
                       "--out", str(tmp_path / "b")], hostile_plugin_path)
    assert result.returncode == 1
    assert "failed in next_transfer: SystemExit: 3 (at " in result.stderr
    result = _testbed(["compare", str(TWO_DC), "-p", "gpipe", "-p", "exits",
                       "--out", str(tmp_path / "c")], hostile_plugin_path)
    assert "exits failed: policy 'exits' failed while planning: SystemExit: 0" in result.stdout
    assert json.loads((tmp_path / "c" / "compare.json").read_text())["runs"][0]["status"] == "ok"


def test_a_real_ctrl_c_in_plugin_code_still_interrupts(hostile_plugin_path: Path,
                                                       tmp_path: Path) -> None:
    import signal
    import time

    ready = tmp_path / "ready"
    env = dict(os.environ, PYTHONPATH=str(hostile_plugin_path), HOSTILE_READY=str(ready))
    process = subprocess.Popen([sys.executable, "-c", "from testbed.cli.main import main; main()",
                                "plan", str(TWO_DC), "-p", "waits"], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ready.exists(), process.communicate()
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.splitlines()[-1] == "testbed: interrupted"


@pytest.mark.usefixtures("clean_host")  # root: `up` plans before it makes any namespace
def test_up_reports_a_plugins_exit(hostile_plugin_path: Path, tmp_path: Path) -> None:
    result = _testbed(["up", str(TWO_DC), "-p", "exits", "--out", str(tmp_path / "run")],
                      hostile_plugin_path)
    assert result.returncode == 1, result.stderr
    assert "policy 'exits' failed while planning: SystemExit: 0 (at " in result.stderr


def _installed() -> list[type[Any]]:
    from testbed.policy.registry import BUBBLE_GROUP

    found = []
    for group in (TRAINING_GROUP, BUBBLE_GROUP):
        found += [info.cls for info in discover(group).values() if info.cls is not None]
    return found


def test_every_policys_settings_are_its_typed_dataclass() -> None:
    """Each option's parser gives its field's type, the default read back is the default,
    and a policy built with options holds them as typed fields."""
    policies = _installed()
    assert len(policies) >= 15
    for cls in policies:
        hints = get_type_hints(cls.settings_type)
        if cls.settings_type is not NoSettings:  # the hooks read what -o sets, typed
            assert get_type_hints(cls)["settings"] is cls.settings_type, cls.name
        for option in cls.options:
            parsed = option.parse(option_text(option.default))
            assert parsed == option.default, (cls.name, option.name)
            kind = hints[option.name]
            expected = str if get_origin(kind) is Literal else kind
            assert isinstance(parsed, expected), (cls.name, option.name)
        policy = cls()
        assert dataclasses.is_dataclass(policy.settings)
        assert isinstance(policy.settings, cls.settings_type)
    atlas = training_policy("atlas", {"connections": "8", "temporal": "off"})
    assert atlas.settings.connections == 8 and atlas.settings.temporal is False
    assert training_policy("atlas-no-temporal").settings.temporal is False  # fixed


def test_a_settings_field_not_made_with_setting_is_refused_at_definition() -> None:
    @dataclasses.dataclass(frozen=True)
    class Loose:
        connections: int = 1

    with pytest.raises(TypeError, match=r"Loose.connections: make it with setting"):
        type("LoosePolicy", (TrainingPolicy,), {"settings_type": Loose, "plan": None})
    with pytest.raises(TypeError, match="fixed names no setting"):
        type("Pinned", (TrainingPolicy,), {"fixed": {"nothing": 1}, "plan": None})


def test_a_bad_option_names_the_policy_and_key() -> None:
    from testbed.errors import InputError

    with pytest.raises(InputError) as bad:
        training_policy("diloco", {"inner_steps": "0"})
    assert str(bad.value) == ("--option: inner_steps: bad value '0' for diloco: must be at "
                              "least 1")


def test_a_ctrl_c_python_could_only_print_still_interrupts(tmp_path: Path) -> None:
    """A Ctrl-C whose handler ran inside a finalizer raises where Python prints "Exception
    ignored" and drops it: the command, which would have finished as if nothing came,
    ends as interrupted all the same."""
    script = textwrap.dedent("""
        import os, signal
        from testbed.cli.main import main
        from testbed.common import sigint
        from testbed.policy.guard import _watch_sigint

        signal.signal(signal.SIGINT, sigint.raise_keyboard_interrupt)
        _watch_sigint()  # as entering plugin code does

        class Finalized:
            def __del__(self) -> None:
                os.kill(os.getpid(), signal.SIGINT)
                sum(range(1000))  # the handler runs here, its exception is dropped

        Finalized()
        print("went on", flush=True)
        main(["--version"])
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=60)
    assert "went on" in result.stdout and "Exception ignored" in result.stderr
    assert result.returncode == 130, result.stderr
    assert result.stderr.splitlines()[-1] == "testbed: interrupted"
