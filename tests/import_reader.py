"""One reader of the imports in testbed/ and plugins/, for both structure tests
(test_layering.py, test_architecture.py). Every form an import can take is read alike, so
none slips past a rule: `import testbed.x`, `from testbed import x` (a module, not a name
in the package), relative imports resolved against the importing module's package, and
`importlib.import_module` or `__import__` called with a literal name. A dynamic import
whose name is not a literal cannot be checked, so it is reported as such."""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGES = (("testbed", "testbed"), ("testbed_plugins", "plugins"))
"""(import name, folder under the repository's root): plugins/ installs as testbed_plugins."""


@dataclass(frozen=True)
class Import:
    module: str
    """What is imported, absolute: the module itself where the name is one of ours (in
    `from testbed.emulator import runtime`, testbed.emulator.runtime), else the package it
    is taken from; ""
    for a dynamic import whose name is not a literal."""
    line: int
    lazy: bool
    """Inside a function: it runs when the function does, not when the module loads."""
    dynamic: bool
    """importlib.import_module or __import__, not an import statement."""


def modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file for every module of ours under `root` (a package by its
    __init__.py, under the package's own name)."""
    found: dict[str, Path] = {}
    for package, folder_name in PACKAGES:
        folder = root / folder_name
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def owner(module: str, known: set[str] | dict[str, Path]) -> str | None:
    """The module of ours that `module` names or lies in (its longest known prefix): a name
    taken from a module (testbed.policy.api.setting) belongs to it; None if not ours."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in known:
            return prefix
    return None


def read(name: str, path: Path, known: set[str] | dict[str, Path]) -> list[Import]:
    """Every import in module `name` (at `path`), in the order written."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    text = path.read_text()
    try:
        tree = _parsed(text)
    except SyntaxError:
        tree = ast.parse(text, str(path))  # raises again, naming the file
    return list(_Reader(package, known).read(tree))


@functools.cache
def _parsed(text: str) -> ast.Module:
    """A module's tree, parsed once per text: the planted-slip tests read whole copies of
    the tree where one file differs. The reader only looks at the tree."""
    return ast.parse(text)


class _Reader:
    def __init__(self, package: str, known: set[str] | dict[str, Path]) -> None:
        self.package, self.known = package, known

    def read(self, tree: ast.AST) -> Iterator[Import]:
        yield from self._visit(tree, lazy=False)

    def _visit(self, node: ast.AST, lazy: bool) -> Iterator[Import]:
        for child in ast.iter_child_nodes(node):
            inner = lazy or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef
                                       | ast.Lambda)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(alias.name, child.lineno, lazy, dynamic=False)
            elif isinstance(child, ast.ImportFrom):
                base = self._absolute(child.module or "", child.level, child.lineno)
                for alias in child.names:
                    full = f"{base}.{alias.name}"
                    module = full if full in self.known else base
                    yield Import(module, child.lineno, lazy, dynamic=False)
            elif isinstance(child, ast.Call) and _is_dynamic_import(child.func):
                yield Import(self._dynamic_name(child), child.lineno, lazy, dynamic=True)
            yield from self._visit(child, inner)

    def _absolute(self, module: str, level: int, line: int) -> str:
        """`from ..x import y`'s package, absolute."""
        if not level:
            return module
        anchor = self.package.split(".")
        if level - 1 >= len(anchor):
            raise ValueError(f"line {line}: a relative import beyond the top-level package")
        base = anchor[: len(anchor) - level + 1]
        return ".".join([*base, module] if module else base)

    def _dynamic_name(self, call: ast.Call) -> str:
        """The literal module name a dynamic import asks for, absolute; "" if not a
        literal."""
        if not call.args:
            return ""
        first = call.args[0]
        if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
            return ""
        text = first.value
        level = len(text) - len(text.lstrip("."))
        return self._absolute(text[level:], level, call.lineno)


def _is_dynamic_import(func: ast.expr) -> bool:
    """importlib.import_module(...), import_module(...), __import__(...),
    builtins.__import__(...)."""
    names = {"import_module", "__import__"}
    if isinstance(func, ast.Name):
        return func.id in names
    return isinstance(func, ast.Attribute) and func.attr in names


def beyond_the_policy_api(name: str, path: Path, known: set[str] | dict[str, Path],
                          package: str) -> list[str]:
    """What plugin module `name` imports that is neither its own `package`'s, the standard
    library's nor testbed.policy.api (the one module a plugin sees), one line each."""
    bad = []
    for imp in read(name, path, known):
        allowed = (imp.module == package or imp.module.startswith(package + ".")
                   or owner(imp.module, known) == "testbed.policy.api"
                   or imp.module.partition(".")[0] in sys.stdlib_module_names)
        if not allowed:
            bad.append(f"{path.name}:{imp.line} imports {imp.module or 'a name not written'}")
    return bad
