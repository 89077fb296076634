"""Processes are started by module name (`python -m testbed....`, the names `down` looks
for in a process's command line, the module torchrun runs on another machine): a string,
which no import checks. Every such name in the package must be a module that exists, and
each one a process is started as must import in a fresh interpreter by that very name, so
a moved module cannot leave its launcher pointing at nothing."""

from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.import_reader import modules

ROOT = Path(__file__).resolve().parent.parent
DOTTED = re.compile(r"testbed(\.[a-z_][a-z0-9_]*)+")


@functools.cache
def named_modules() -> dict[str, str]:
    """Every string literal in testbed/ that is a whole dotted name inside one of our
    top-level packages or modules (not an entry-point group such as testbed.policies) ->
    where the first one is ("file:line"). Read once a process (every file of testbed/
    parsed: 0.6 s), at collection for the parameters, then by the tests."""
    known = modules(ROOT)
    found: dict[str, str] = {}
    for path in sorted((ROOT / "testbed").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and DOTTED.fullmatch(node.value)
                    and ".".join(node.value.split(".")[:2]) in known):
                found.setdefault(node.value, f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def entry_modules() -> list[str]:
    """The named modules a process is started as: those with a `__main__` block."""
    known = modules(ROOT)
    return sorted(name for name in named_modules() if name in known
                  and 'if __name__ == "__main__":' in known[name].read_text())


def test_every_module_named_in_a_string_exists() -> None:
    known = modules(ROOT)
    missing = [f"{where}: {name}" for name, where in named_modules().items()
               if name not in known]
    assert not missing, missing


def test_the_worker_processes_are_among_the_entry_modules() -> None:
    """The coordinator starts workers and decode servers, torchrun the joining process."""
    assert {"testbed.emulator.runtime.worker.process", "testbed.emulator.runtime.worker.decode",
            "testbed.emulator.runtime.worker.join"} <= set(entry_modules())


@pytest.mark.parametrize("name", entry_modules())
def test_an_entry_module_imports_by_the_name_it_is_started_as(name: str) -> None:
    code = f"import importlib; importlib.import_module({name!r})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
