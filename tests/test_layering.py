"""The house rules, checked: no import circles, plugins see only the policy API, and no
module grows past what one reader holds in mind."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    """Dotted name -> file, plugins/ under its installed name testbed_plugins."""
    found: dict[str, Path] = {}
    for package, folder in (("testbed", ROOT / "testbed"), ("testbed_plugins", ROOT / "plugins")):
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _top_level_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Modules of ours `name` imports at module level, `if TYPE_CHECKING:` included
    (function-level imports are lazy on purpose and left out)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    nodes = [n for top in tree.body
             for n in ([top, *top.body] if isinstance(top, ast.If) else [top])]
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
    return {m for m in out if m in known and m != name}


def test_no_import_circles() -> None:
    modules = _modules()
    graph = {n: _top_level_imports(n, p, set(modules)) for n, p in modules.items()}
    # a package's __init__ importing its own submodules is how packages re-export
    for name in graph:
        graph[name] = {m for m in graph[name] if not (name and m.startswith(name + "."))}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt):], nxt]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    sys.setrecursionlimit(10000)
    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_plugins_import_only_the_policy_api() -> None:
    for name, path in _modules().items():
        if not name.startswith("testbed_plugins"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and not node.level:
                module = node.module or ""
            elif isinstance(node, ast.Import):
                module = node.names[0].name
            else:
                continue
            top = module.split(".")[0]
            assert top in sys.stdlib_module_names or module == "testbed.policy.api" or \
                module.startswith("testbed_plugins"), f"{path.name} imports {module}"


def test_no_module_is_over_400_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in _modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, long
