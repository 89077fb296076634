"""The house rules, checked: no import circles, plugins see only the policy API, every
dynamic import names its module, no module grows past what one reader holds in mind, and
untyped mappings do not creep back.
Imports are read by tests/import_reader.py, which the architecture's table shares."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from tests.import_reader import beyond_the_policy_api, modules, owner, read

ROOT = Path(__file__).resolve().parent.parent
SOFT_MAX_LINES = 600
"""Generous on purpose: what keeps a function readable is the complexity ceiling in
pyproject.toml (ruff's C901, PLR0912, PLR0915); this only says when a module has grown
into two jobs. A file is never squeezed to meet it (a docstring is not a trailing
comment): past it, the module splits along its concerns."""


MAX_ANY_DICTS = 25
"""`dict[str, Any]` written out in testbed/, each with a comment saying why: keyword
arguments (click's, a dataclass's, pyroute2's, matplotlib's), torch's state dicts, type
hints by name, and the definition of common.codec.JsonObject. Values passed between parts
have dataclasses or TypedDicts; lower this as uses go, never raise it."""
MAX_JSON_OBJECTS = 54
"""Lines in testbed/ that name JsonObject (imports aside): raw JSON or YAML before it is
checked (a file or a control message as read, a flag's value, a file's document edited
as raw data before it is parsed again), a document of a format of its own (a JSON
Schema, results.json as written for code that reads JSON, and as read, which may predate
the schema), what users or policies choose the keys of (a policy's notes and options, a
trace generator's settings, a run's settings by name) or the codec's generic to and from
JSON. The alias names what is raw; it types nothing, so it is counted as well."""


def lines_naming(text: str, root: Path) -> list[str]:
    """`file:line` of each line under `root` that holds `text`, import lines aside."""
    return [f"{path.relative_to(ROOT)}:{number}" for path in sorted(root.rglob("*.py"))
            for number, line in enumerate(path.read_text().splitlines(), start=1)
            if text in line and not line.lstrip().startswith(("from ", "import "))]


def import_circles(root: Path) -> list[str]:
    """The first import circle among the modules under `root`, as `a -> b -> a`; imports
    that run when a module loads count (TYPE_CHECKING's too), those inside functions are
    lazy on purpose and do not."""
    found = modules(root)
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        targets = {owner(imp.module, found) for imp in read(name, path, found) if not imp.lazy}
        graph[name] = {t for t in targets if t is not None and t != name}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return []

    sys.setrecursionlimit(10000)
    for name in sorted(graph):
        if name not in state and (cycle := visit(name)):
            return [" -> ".join(cycle)]
    return []


def plugin_imports(root: Path) -> list[str]:
    """Every import of the built-in plugins beyond the policy API."""
    found = modules(root)
    return [line for name, path in found.items() if name.startswith("testbed_plugins")
            for line in beyond_the_policy_api(name, path, found, "testbed_plugins")]


def unnamed_dynamic_imports(root: Path) -> list[str]:
    """importlib.import_module or __import__ whose module is not a literal: no rule can
    read what it imports (a plugin loads by its entry point instead)."""
    found = modules(root)
    return [f"{path.relative_to(root)}:{imp.line}" for name, path in found.items()
            for imp in read(name, path, found) if imp.dynamic and not imp.module]


def test_no_import_circles() -> None:
    assert not import_circles(ROOT), import_circles(ROOT)


def test_plugins_import_only_the_policy_api() -> None:
    assert not plugin_imports(ROOT), "\n".join(plugin_imports(ROOT))


def test_every_dynamic_import_names_its_module() -> None:
    assert not unnamed_dynamic_imports(ROOT), unnamed_dynamic_imports(ROOT)


def test_no_module_is_over_the_soft_limit() -> None:
    long = {str(p.relative_to(ROOT)): n for p in modules(ROOT).values()
            if (n := len(p.read_text().splitlines())) > SOFT_MAX_LINES}
    assert not long, f"past {SOFT_MAX_LINES} lines, split along its concerns: {long}"


def test_untyped_mappings_do_not_creep_back() -> None:
    bare = lines_naming("dict[str, Any]", ROOT / "testbed")
    assert len(bare) <= MAX_ANY_DICTS, (
        f"{len(bare)} dict[str, Any] in testbed/, at most {MAX_ANY_DICTS}: type the value "
        f"(a dataclass or a TypedDict), or name raw JSON JsonObject: {bare}")
    raw = lines_naming("JsonObject", ROOT / "testbed")
    assert len(raw) <= MAX_JSON_OBJECTS, (
        f"{len(raw)} lines name JsonObject, at most {MAX_JSON_OBJECTS}: a value passed "
        f"between parts gets a type of its own: {raw}")


# The rules above must hold whatever form an import takes: each form planted in a copy of
# the tree makes them fail.
CIRCLE_SLIPS = {
    # testbed.errors is imported by testbed.topology's modules: importing it back closes
    # a circle
    "relative": "from . import topology",
    "bare package": "from testbed import topology",
    "import testbed.x": "import testbed.topology",
    "importlib literal": "import importlib\nimportlib.import_module('testbed.topology')",
}
# (a relative import in plugins/ reaches only the plugins' own modules; ruff bans the form)
PLUGIN_SLIPS = {
    "bare package": "from testbed.emulator import runtime",
    "import testbed.x": "import testbed.emulator.runtime",
    "importlib literal": "import importlib\nimportlib.import_module('testbed.emulator.runtime')",
    "__import__ literal": "__import__('testbed.emulator.runtime.worker')",
}


def _copy(tmp_path: Path) -> Path:
    for folder in ("testbed", "plugins"):
        shutil.copytree(ROOT / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _plant(root: Path, module: str, line: str) -> None:
    path = root / module
    path.write_text(path.read_text() + "\n" + line + "\n")


@pytest.mark.parametrize("slip", sorted(CIRCLE_SLIPS))
def test_a_planted_circle_fails_in_any_form(tmp_path: Path, slip: str) -> None:
    root = _copy(tmp_path)
    assert not import_circles(root)
    _plant(root, "testbed/errors.py", CIRCLE_SLIPS[slip])
    circle = import_circles(root)
    assert circle and "testbed.errors -> testbed.topology" in circle[0], circle


@pytest.mark.parametrize("slip", sorted(PLUGIN_SLIPS))
def test_a_plugin_reaching_past_the_api_fails_in_any_form(tmp_path: Path, slip: str) -> None:
    root = _copy(tmp_path)
    _plant(root, "plugins/baselines/bubbles.py", PLUGIN_SLIPS[slip])
    bad = plugin_imports(root)
    assert bad and all("bubbles.py" in line and "testbed.emulator.runtime" in line
                       for line in bad), bad


def test_a_dynamic_import_of_a_computed_name_fails(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    path = root / "testbed/sim/network.py"
    _plant(root, "testbed/sim/network.py",
           "import importlib\nPART = 'runtime'\nimportlib.import_module(f'testbed.{PART}')")
    assert unnamed_dynamic_imports(root) == [
        f"testbed/sim/network.py:{len(path.read_text().splitlines())}"]
