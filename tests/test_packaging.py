"""The wheel holds every package of the source tree: an install that is not editable must
import what the command imports (scripts/check_wheel runs such an install end to end)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

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
    (wheel,) = tmp_path.glob("testbed-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    packed = {name for name in names if name.endswith(".py")}
    assert _source_modules() - packed == set()
    assert "testbed/report/results.schema.json" in names  # `testbed results validate` reads it
