"""The example policy package installs like any third-party plugin and works end to end:
listed, planning, simulating, honouring the job's tp, dp and pp; the plugin guide
(docs/plugins.md) shows its code."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from .conftest import ROOT, TOPOLOGIES
from .import_reader import beyond_the_policy_api, modules
from .test_plugins import run_testbed

EXAMPLE = ROOT / "examples" / "testbed-example-policy"
GUIDE = ROOT / "docs" / "plugins.md"
GUIDE_FILE = re.compile(r"^```(?:python|toml)\n# (?P<path>[\w./-]+)\n(?P<text>.*?)^```\n",
                        re.M | re.S)
"""A block of the plugin guide that is a whole file of its first policy's package, named
by its first line (`# window_fill.py`)."""


@pytest.fixture(scope="module")
def example_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example installed by pip into a private folder (from a copy, so that the build
    leaves nothing in the source tree); put it on PYTHONPATH to use it."""
    source = tmp_path_factory.mktemp("source") / EXAMPLE.name
    shutil.copytree(EXAMPLE, source,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(source)],
        check=True, cwd=source.parent, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    return target


def _simulate(example_path: Path, tmp_path: Path, topology: str, *args: str) -> dict[str, Any]:
    out = tmp_path / "run"
    result = run_testbed(["simulate", str(TOPOLOGIES / topology), "-p", "striped-pipeline",
                          *args, "--out", str(out)], example_path)
    assert result.returncode == 0, result.stderr
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results


def test_the_example_is_listed(example_path: Path) -> None:
    result = run_testbed(["plugins", "--json"], example_path)
    assert result.returncode == 0, result.stderr
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    training, bubbles = rows["striped-pipeline"], rows["shortest-first"]
    assert (training["kind"], training["status"]) == ("training", "ok")
    assert (bubbles["kind"], bubbles["status"]) == ("bubble", "ok")
    assert training["distribution"] == bubbles["distribution"] == "testbed-example-policy"
    assert training["options"]["connections"]["default"] == 4


def test_the_example_plans_with_its_connections(example_path: Path) -> None:
    result = run_testbed(["plan", str(TOPOLOGIES / "two-dc.yaml"), "-p", "striped-pipeline",
                          "-o", "connections=6", "-o", "schedule=gpipe"], example_path)
    assert result.returncode == 0, result.stderr
    assert "TCP connections per peer pair: 1, 6" in result.stdout
    refused = run_testbed(["plan", str(TOPOLOGIES / "two-dc.yaml"), "-p", "striped-pipeline",
                           "-o", "connections=0"], example_path)
    assert refused.returncode == 2 and "must be at least 1" in refused.stderr


def test_the_example_simulates_with_its_bubble_policy(example_path: Path,
                                                      tmp_path: Path) -> None:
    # four stages: a stage of three cannot hold the 7B inference model beside training
    results = _simulate(example_path, tmp_path, "paper-3dc.yaml", "-b", "shortest-first",
                        "--iterations", "2", "--pp", "4")
    assert results["status"] == "ok" and results["error"] is None
    assert results["plan"]["policy"] == "striped-pipeline"
    assert results["bubble_policy"] == "shortest-first"
    assert results["inference"]["served"] > 0


@pytest.mark.parametrize(("dp", "pp", "tp"), [(1, 2, 2), (1, 4, 1), (2, 1, 2), (1, 1, 1)])
def test_the_example_honours_tp_dp_and_pp(example_path: Path, tmp_path: Path, dp: int,
                                          pp: int, tp: int) -> None:
    results = _simulate(example_path, tmp_path, "two-dc.yaml", "--dp", str(dp), "--pp",
                        str(pp), "--set", f"tp={tp}")
    plan = results["plan"]
    assert results["status"] == "ok"
    assert (plan["dp"], plan["pp"], plan["tp"]) == (dp, pp, tp)
    hosts = ["east-0", "east-1", "west-0", "west-1"]
    for key, gpus in plan["placement"].items():  # stages in file order, replicas side by side
        replica, stage = map(int, key.split(","))
        first = (stage * dp + replica) * tp
        assert gpus == hosts[first:first + tp]


def test_the_plugin_guide_shows_the_examples_real_code() -> None:
    """The guide's blocks that name no file of their own (the first policy's do: see
    test_the_plugin_guides_first_policy_builds_installs_and_passes_its_tests)."""
    section = GUIDE_FILE.sub("", GUIDE.read_text(encoding="utf-8"))
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    sources = [path.read_text(encoding="utf-8")
               for path in sorted((EXAMPLE / "testbed_example").glob("*.py"))]
    assert blocks and all(any(block.strip() in source for source in sources)
                          for block in blocks)
    assert "class StripedPipeline" in blocks[0]
    assert any("class LocalSgd" in block for block in blocks)
    entry_points = (EXAMPLE / "pyproject.toml").read_text(encoding="utf-8")
    for block in re.findall(r"```toml\n(.*?)```", section, re.S):
        assert block.strip() in entry_points


def test_the_example_imports_only_the_policy_api() -> None:
    """Like the built-in plugins (tests/test_layering.py), the example uses testbed through
    its SDK alone: what it needs must be in testbed.policy.api."""
    files = sorted((EXAMPLE / "testbed_example").glob("*.py"))
    assert len(files) >= 3
    own = {("testbed_example" if p.stem == "__init__" else f"testbed_example.{p.stem}"): p
           for p in files}
    known = {**modules(ROOT), **own}
    bad = [line for name, path in own.items()
           for line in beyond_the_policy_api(name, path, known, "testbed_example")]
    assert not bad, bad


def test_the_local_sgd_example_averages_every_n_steps(example_path: Path,
                                                      tmp_path: Path) -> None:
    """A third party's plan that spans iterations: its cycle runs in the simulator, moving
    a whole replica's parameters across the WAN once per cycle."""
    out = tmp_path / "run"
    result = run_testbed(["simulate", str(TOPOLOGIES / "two-dc.yaml"), "-p", "local-sgd",
                          "-o", "every=3", "--iterations", "5", "--out", str(out)],
                         example_path)
    assert result.returncode == 0, result.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["iterations"] == 6  # whole cycles
    assert results["cycle_time_s"]["period"] == 3
    assert results["plan"]["outer"] == {"lr": 1.0, "momentum": 0.0, "nesterov": False,
                                        "mixing": 0.0}
    assert results["wan"]["bytes"] > 0


def _install(source: Path, target: Path) -> None:
    """`pip install` of a package folder into a private one (from a copy: the build leaves
    nothing in the source tree), offline: no dependencies, the venv's setuptools."""
    build = target.parent / f"{source.name}-build"
    shutil.copytree(source, build,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(build)],
        check=True, cwd=build.parent, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )


def test_the_plugin_guides_first_policy_builds_installs_and_passes_its_tests(
        tmp_path: Path) -> None:
    """A newcomer's policy from the docs alone: the guide's files (the policy, its
    pyproject, its tests) written out as its package, installed as pip installs a
    plugin, its own tests run with pytest in its folder, and each policy its pyproject
    registers planned and simulated by the commands on two-dc, as the guide runs them."""
    package = tmp_path / "package"
    files = {m["path"]: m["text"] for m in GUIDE_FILE.finditer(GUIDE.read_text(encoding="utf-8"))}
    assert "pyproject.toml" in files and any(p.startswith("tests/test_") for p in files), files
    for path, text in files.items():
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text(text, encoding="utf-8")
    site = tmp_path / "site"
    _install(package, site)

    tests = [p for p in files if p.startswith("tests/")]
    defined = sum(len(re.findall(r"^def test_", files[p], re.M)) for p in tests)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(site), os.environ.get("PYTHONPATH", "")]))}
    ran = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          *tests], cwd=package, env=env, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"{defined} passed" in ran.stdout, ran.stdout

    project = tomllib.loads(files["pyproject.toml"])
    policies = project["project"]["entry-points"]["testbed.policies"]
    assert policies
    for name in policies:
        planned = run_testbed(["plan", str(TOPOLOGIES / "two-dc.yaml"), "-p", name], site)
        assert planned.returncode == 0, planned.stderr
        out = tmp_path / f"run-{name}"
        simulated = run_testbed(["simulate", str(TOPOLOGIES / "two-dc.yaml"), "-p", name,
                                 "--out", str(out)], site)
        assert simulated.returncode == 0, simulated.stderr
        results = json.loads((out / "results.json").read_text())
        assert results["status"] == "ok" and results["plan"]["policy"] == name
        assert results["tokens_per_s"] > 0

    # the guide's commands after its `pip install`, from a folder standing for testbed's
    # root, with the environment's bin on PATH
    commands = [line for block in re.findall(r"```sh\n(.*?)```", GUIDE.read_text(), re.S)
                if "pip install" in block
                for line in block.splitlines() if line.startswith("testbed ")]
    assert commands
    root = tmp_path / "root"
    root.mkdir()
    (root / "topologies").symlink_to(TOPOLOGIES)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=root, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, (command, done.stderr)
