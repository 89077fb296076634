"""The wheel holds every package of the source tree: an install that is not editable must
import what the command imports (scripts/check_wheel runs such an install end to end)."""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

from testbed import DISTRIBUTION, __version__
from testbed.report.results import versions
from tests.conftest import ROOT


def _source_modules() -> set[str]:
    found = set()
    for folder, installed in (("testbed", "testbed"), ("plugins", "testbed_plugins")):
        for path in (ROOT / folder).rglob("*.py"):
            found.add(f"{installed}/{path.relative_to(ROOT / folder).as_posix()}")
    return found


def test_the_wheel_holds_every_module(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: a build folder left in the checkout would hide a gap
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".*", "build", "*.egg-info", "__pycache__", "runs", "benchmarks", "tests"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(source)],
        check=True, cwd=tmp_path, capture_output=True,
    )
    (wheel,) = tmp_path.glob(f"{DISTRIBUTION.replace('-', '_')}-{__version__}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    packed = {name for name in names if name.endswith(".py")}
    assert _source_modules() - packed == set()
    assert "testbed/report/results.schema.json" in names  # `testbed results validate` reads it


def test_the_distribution_has_a_name_of_its_own_everywhere_it_is_named() -> None:
    """`testbed` on the package index is an unrelated project: `pip install 'testbed[ray]'`
    or a plugin's `dependencies = ["testbed"]` would fetch that. The import package and
    the command keep the name; the distribution is testbed.DISTRIBUTION wherever it is
    named (pyproject, the example plugin's dependencies, every `pip install` of an extra
    in the docs and messages), and results.json records its version."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == DISTRIBUTION != "testbed"
    assert "testbed" in project["scripts"]
    assert importlib.metadata.version(DISTRIBUTION) == project["version"] == __version__
    assert versions()["testbed"] == __version__
    example = tomllib.loads((ROOT / "examples" / "testbed-example-policy" / "pyproject.toml")
                            .read_text(encoding="utf-8"))["project"]
    assert [re.split(r"[\s\[<>=!~;]", dep)[0] for dep in example["dependencies"]] \
        == [DISTRIBUTION]
    named = []
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md"),
                 *(ROOT / "testbed").rglob("*.py"),
                 *(p for p in (ROOT / "scripts").rglob("*") if p.is_file())]:
        text = path.read_text(encoding="utf-8")
        named += [(path.name, name) for name in re.findall(r"pip install '([^'\[]+)\[", text)]
    assert named and {name for _, name in named} <= {DISTRIBUTION, "{DISTRIBUTION}", "."}, named


def _apt_get(tmp_path: Path, fails: int, message: str, wait_s: float
             ) -> subprocess.CompletedProcess[str]:
    """scripts/setup's apt_get (its own text) against an apt-get that fails `fails` times
    with `message`, then succeeds; it records each call's arguments."""
    script = (ROOT / "scripts" / "setup").read_text(encoding="utf-8")
    functions = [re.search(r"^say\(\) \{.*\}\n", script, re.M),
                 re.search(r"^apt_get\(\) \{\n.*?^\}\n", script, re.M | re.S)]
    assert all(functions), "scripts/setup defines say and apt_get"
    fake = tmp_path / "bin" / "apt-get"
    fake.parent.mkdir(parents=True)
    fake.write_text(f"""#!/usr/bin/env bash
echo "$*" >> {tmp_path}/calls
if [ "$(wc -l < {tmp_path}/calls)" -le {fails} ]; then echo "{message}" >&2; exit 100; fi
""")
    fake.chmod(0o755)
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail\nLOCK_WAIT_S={wait_s}\nLOCK_RETRY_S=0.2\n"
         f"{''.join(f[0] for f in functions if f)}\napt_get install -y iperf3"],
        env={**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"},
        capture_output=True, text=True, timeout=60)


LOCKED = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 7 (apt-get)"


def test_setup_waits_for_another_apt_instead_of_failing(tmp_path: Path) -> None:
    """apt-get fails at once on the package lists' lock held by another apt (unattended
    upgrades on a machine just started); DPkg::Lock::Timeout covers dpkg's lock only."""
    done = _apt_get(tmp_path, 2, LOCKED, 30)
    assert done.returncode == 0, done.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == ["-o DPkg::Lock::Timeout=30 install -y iperf3"] * 3
    assert done.stdout.count("setup: waiting (up to 30 s) for another apt or dpkg") == 1


def test_setup_fails_on_another_apt_error_or_a_lock_held_too_long(tmp_path: Path) -> None:
    broken = _apt_get(tmp_path / "a", 1, "E: Unable to locate package iperf3", 30)
    assert broken.returncode == 100 and "Unable to locate package" in broken.stderr
    assert len((tmp_path / "a" / "calls").read_text().splitlines()) == 1
    held = _apt_get(tmp_path / "b", 1000, LOCKED, 1)
    assert held.returncode == 100 and "Could not get lock" in held.stderr


def test_setup_says_each_step() -> None:
    script = (ROOT / "scripts" / "setup").read_text(encoding="utf-8")
    steps = re.findall(r'^\s*say "([^"]*)', script, re.M)
    assert any(step.startswith("installing torch") for step in steps)
    assert any(step.startswith("installing testbed") for step in steps)
    assert "apt_get install" in script and "apt-get install" not in script
