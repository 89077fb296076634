"""The architecture as a table: which part of the package may import which. A part is a
folder of testbed/ (runtime's three: the wire between the processes, the worker, the
coordinator); lazy imports inside functions count too, since they bind the layers as
surely as imports at the top of a module."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "testbed"

# Lowest first. A part may import itself, errors, and the parts its row names.
BASE = {"common"}
INPUTS = BASE | {"topology", "job", "scenario", "loss"}
COSTS = INPUTS | {"plan"}
POLICIES = COSTS | {"policy", "inference"}
RESULTS = POLICIES | {"metrics", "report"}
SIMULATOR = RESULTS | {"sim"}
A_RUN = SIMULATOR | {"net", "run"}
RUNTIME = A_RUN | {"runtime.wire", "runtime.worker", "runtime.coordinator", "runtime.launch"}
MAY_IMPORT: dict[str, set[str]] = {
    "common": set(),
    "topology": BASE,
    "job": BASE | {"topology"},
    "scenario": BASE | {"topology"},
    "loss": BASE,
    "plan": INPUTS - {"scenario"},
    "policy": COSTS,
    "inference": COSTS | {"policy"},
    "metrics": POLICIES,
    "report": POLICIES | {"metrics"},
    "sim": RESULTS,
    "net": INPUTS | {"plan"},
    "run": SIMULATOR | {"net"},
    "runtime.wire": A_RUN,
    "runtime.worker": A_RUN | {"runtime.wire"},
    "runtime.coordinator": A_RUN | {"runtime.wire", "runtime.worker"},
    "runtime.launch": A_RUN | {"runtime.wire", "runtime.worker", "runtime.coordinator"},
    "backends": RUNTIME,
    "experiments": RUNTIME | {"backends"},
    "figures": RUNTIME | {"backends", "experiments"},
    "api": RUNTIME | {"backends", "experiments", "figures"},
    "cli": RUNTIME | {"backends", "experiments", "figures", "api"},
}
EVERYWHERE = {"errors", "__init__"}


def _part(module: str) -> str:
    """testbed.runtime.worker.transport -> runtime.worker; testbed.sim.network -> sim;
    testbed.api -> api."""
    parts = module.split(".")[1:]
    if parts[0] == "runtime" and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {name for name in out if name.startswith("testbed.")}


def _crossings() -> list[str]:
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(("testbed", *path.relative_to(PACKAGE).with_suffix("").parts))
        if module == "testbed.__init__":
            continue
        part = _part(module)
        for target in sorted(_imports(path)):
            to = _part(target)
            if to not in MAY_IMPORT and to not in EVERYWHERE:
                continue  # `from testbed.x import name` where the name is a module's attribute
            if to != part and to not in EVERYWHERE and to not in MAY_IMPORT[part]:
                bad.append(f"{path.relative_to(PACKAGE.parent)}: {part} imports {target}")
    return bad


def test_every_folder_has_a_row() -> None:
    modules = [p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"]
    folders = {_part(".".join(("testbed", *m.with_suffix("").parts)))
               for m in modules if len(m.parts) > 1}
    assert folders <= set(MAY_IMPORT), folders - set(MAY_IMPORT)


def test_no_part_imports_a_part_above_it() -> None:
    assert not _crossings(), "\n".join(_crossings())


def test_the_simulator_never_imports_the_runtime() -> None:
    assert not any(p.startswith("runtime") or p in {"backends", "net"}
                   for p in MAY_IMPORT["sim"])
