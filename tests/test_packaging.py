"""The wheel holds every package of the source tree: an install that is not editable must
import what the command imports (scripts/check_wheel runs such an install end to end)."""

from __future__ import annotations

import importlib.metadata
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
                 *(ROOT / "testbed").rglob("*.py"), *(ROOT / "scripts").iterdir()]:
        text = path.read_text(encoding="utf-8")
        named += [(path.name, name) for name in re.findall(r"pip install '([^'\[]+)\[", text)]
    assert named and {name for _, name in named} <= {DISTRIBUTION, "{DISTRIBUTION}", "."}, named
