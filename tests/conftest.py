"""Shared fixtures; hypothesis profiles: `dev` (default, quick) and `ci` (more examples)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Planning answers kept across commands (testbed.common.memo) would let one test's search
# answer another's, and fill the user's cache: off here (and in every command a test
# starts); tests of the store name a folder of their own.
os.environ["TESTBED_PLANNING_STORE"] = "off"

# pytest-xdist's workers start with SIGINT ignored, and the commands tests start would
# inherit that (a command started so keeps Ctrl-C ignored, as it should): the tests that
# stop a command with Ctrl-C need it live, as at a terminal.
if os.environ.get("PYTEST_XDIST_WORKER"):
    signal.signal(signal.SIGINT, signal.default_int_handler)

ROOT = Path(__file__).resolve().parent.parent
TOPOLOGIES = ROOT / "topologies"


_SEARCHES: dict[Any, Any] = {}


@pytest.fixture
def shared_planning() -> Iterator[None]:
    """Plans made in the test's process keep their searches' simulations in one cache for
    the session, as one command's plans share one (testbed.experiments.planning): for
    tests of what a run does, which would otherwise search the same inputs again (Atlas
    on paper-3dc, seconds each time). A search answers the same from it as afresh; not
    for tests of the search itself, nor any that patches what it simulates."""
    from testbed.experiments.planning import shared_cache

    with shared_cache(cache=_SEARCHES):
        yield


@pytest.fixture
def topologies_dir() -> Path:
    return TOPOLOGIES


@pytest.fixture(scope="session")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample plugin (tests/fixtures/sample_plugin, its own pyproject) installed into a
    private folder, as `pip install` would for a user; put it on PYTHONPATH to use it."""
    return _install_plugin("sample_plugin", tmp_path_factory)


@pytest.fixture(scope="session")
def hostile_plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/fixtures/hostile_plugin installed as `plugin_path` is: policies that exit,
    interrupt or crash from plugin code."""
    return _install_plugin("hostile_plugin", tmp_path_factory)


def _install_plugin(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import subprocess
    import sys

    target = tmp_path_factory.mktemp("site")
    build = tmp_path_factory.mktemp("build")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), str(Path(__file__).parent / "fixtures" / name)],
        check=True, cwd=build, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    return target


def _our_processes() -> list[int]:
    from testbed.emulator.net.cleanup import stray_processes

    return stray_processes()


@pytest.hookimpl(wrapper=True)
def pytest_collection() -> object:
    """pytest keeps each test module's rewritten bytecode (tests/__pycache__) only where
    the process that collects may write bytecode. Under PYTHONDONTWRITEBYTECODE every
    collection rewrote the asserts of every module again: 4-5 s of each process that
    collects (each xdist worker, then the root tests' run). Allowed while collecting
    only: what the tests import later (scripts/, read as text by the packaging test) and
    the commands and workers they start keep the environment's setting."""
    kept = sys.dont_write_bytecode
    sys.dont_write_bytecode = False
    try:
        return (yield)
    finally:
        sys.dont_write_bytecode = kept


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses `clean_host` is a root test whether or not it says so: `-m 'not
    root'` must leave it out, since its check ends with `down()` on this host."""
    for item in items:
        if "clean_host" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.root)


@pytest.fixture
def clean_host():
    """Root tests: skip without root; afterwards no namespace or process of ours may remain."""
    if os.geteuid() != 0:
        pytest.skip("needs root for network namespaces (CI runs as root)")
    from testbed.emulator.net.netns import list_namespaces

    before = set(list_namespaces())
    yield
    left = set(list_namespaces()) - before
    strays = _our_processes()
    if left or strays:
        from testbed.emulator.net.cleanup import down

        down()
    assert not left, f"namespaces left behind: {sorted(left)}"
    assert not strays, f"processes left behind: {strays}"


def machine_prefix() -> str:
    """Namespace prefix for the "machines" of a cluster test, unique to this process: the
    suite may run twice at once on one host."""
    return f"tbcl{os.getpid() % 100000}-"
