"""The architecture as a table: which part of the package imports which. A part is a
folder of testbed/ (runtime's four: the wire between the processes, the worker, the
coordinator, `testbed launch`); lazy imports inside functions and dynamic imports count
too, since they bind the parts as surely as imports at the top of a module. The table
holds the crossings the design makes and no more: a new one is a decision, made by adding
it here. Imports are read by tests/import_reader.py, which test_layering.py shares."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.import_reader import modules, owner, read

ROOT = Path(__file__).resolve().parent.parent

# Lowest first: a part imports itself, errors, the package's __init__ and the parts its row
# names, all of them rows above its own.
MAY_IMPORT: dict[str, set[str]] = {
    "common": set(),
    "topology": {"common"},
    "job": {"common", "topology"},
    "scenario": {"common", "topology"},
    "loss": set(),
    "plan": {"common", "job", "topology"},
    "policy": {"common", "job", "loss", "plan", "topology"},
    "inference": {"common", "job", "plan", "policy", "topology"},
    "metrics": {"common", "job", "loss"},
    "report": {"common", "inference", "job", "loss", "metrics", "plan", "scenario",
               "topology"},
    "sim": {"common", "inference", "job", "metrics", "plan", "policy", "report", "scenario",
            "topology"},
    "net": {"common", "plan", "topology"},
    "run": {"common", "inference", "job", "metrics", "net", "plan", "policy", "report",
            "scenario", "sim", "topology"},
    "runtime.wire": {"common", "job", "plan", "scenario", "topology"},
    "runtime.worker": {"common", "job", "net", "plan", "run", "runtime.wire", "scenario",
                       "topology"},
    "runtime.coordinator": {"common", "inference", "job", "metrics", "net", "plan", "policy",
                            "run", "runtime.wire", "runtime.worker", "scenario", "sim",
                            "topology"},
    "runtime.launch": {"common", "job", "metrics", "net", "policy", "report",
                       "runtime.coordinator", "runtime.wire", "runtime.worker", "scenario",
                       "sim", "topology"},
    "backends": {"common", "inference", "metrics", "net", "plan", "policy", "report", "run",
                 "runtime.coordinator", "runtime.worker", "sim", "topology"},
    "experiments": {"backends", "common", "inference", "job", "metrics", "net", "plan",
                    "policy", "report", "run", "runtime.coordinator", "scenario", "sim",
                    "topology"},
    "figures": {"common", "experiments", "job", "metrics", "net", "plan", "policy", "report",
                "run", "runtime.coordinator", "sim", "topology"},
    "api": {"common", "experiments", "metrics", "plan", "policy", "report", "run", "sim"},
    "cli": {"api", "common", "experiments", "figures", "metrics", "net", "plan", "policy",
            "report", "run", "runtime.launch", "runtime.wire", "sim", "topology"},
}
EVERYWHERE = {"errors", "__init__"}
GROUPS = {"runtime": {"runtime.wire", "runtime.worker", "runtime.coordinator",
                      "runtime.launch"}}
"""A folder split into parts: importing it bare (`from testbed import runtime`) reaches
every one of them."""


def part(module: str) -> str:
    """testbed.runtime.worker.transport -> runtime.worker; testbed.sim.network -> sim;
    testbed.api -> api; testbed.runtime -> runtime; testbed -> __init__."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    if parts[0] in GROUPS and len(parts) > 1:
        return ".".join(parts[:2])
    return parts[0]


def _allowed(source: str, target: str) -> bool:
    if target in GROUPS:
        return source in GROUPS[target] or GROUPS[target] <= MAY_IMPORT.get(source, set())
    return target in (source, *EVERYWHERE) or target in MAY_IMPORT.get(source, set())


def used(root: Path) -> tuple[dict[tuple[str, str], str], list[str]]:
    """Every crossing from one part to another under `root`, with the first import that
    makes it ("file:line"); and imports whose part has no row."""
    found = {n: p for n, p in modules(root).items() if n.partition(".")[0] == "testbed"}
    crossings: dict[tuple[str, str], str] = {}
    unknown = []
    for name, path in found.items():
        source = part(name)
        for imp in read(name, path, found):
            target = owner(imp.module, found)
            if target is None:
                continue
            to = part(target)
            where = f"{path.relative_to(root)}:{imp.line}"
            if to not in MAY_IMPORT and to not in EVERYWHERE and to not in GROUPS:
                unknown.append(f"{where}: {to} has no row")
            elif to != source and to not in EVERYWHERE:
                crossings.setdefault((source, to), f"{where} imports {imp.module}")
    return crossings, unknown


def crossings_not_in_the_table(root: Path) -> list[str]:
    crossings, unknown = used(root)
    return unknown + [f"{where}: {source} imports {to}"
                      for (source, to), where in sorted(crossings.items())
                      if not _allowed(source, to)]


def test_every_folder_has_a_row() -> None:
    names = [n for n in modules(ROOT) if n.startswith("testbed.") and n.count(".") > 1]
    folders = {part(n) for n in names} - set(GROUPS)
    assert folders <= set(MAY_IMPORT), folders - set(MAY_IMPORT)


def test_no_part_imports_one_the_table_does_not_name() -> None:
    bad = crossings_not_in_the_table(ROOT)
    assert not bad, "\n".join(bad)


def test_the_table_names_no_crossing_the_code_does_not_make() -> None:
    """So the table says what the design is, not what it would let pass."""
    crossings, _ = used(ROOT)
    stale = sorted(f"{source} -> {to}" for source, row in MAY_IMPORT.items() for to in row
                   if (source, to) not in crossings)
    assert not stale, stale


def test_the_table_is_layered() -> None:
    """Each row names only rows above it: no part imports upward, and no two parts import
    each other."""
    order = list(MAY_IMPORT)
    upward = [f"{source} -> {to}" for source, row in MAY_IMPORT.items() for to in row
              if to not in order[: order.index(source)]]
    assert not upward, upward


def test_the_simulator_never_imports_the_runtime() -> None:
    assert not any(p.startswith("runtime") or p in {"backends", "net", "run"}
                   for p in MAY_IMPORT["sim"])


# Every form an import takes is read: each planted in a copy of the simulator's flow model
# (which must not reach the emulator's runtime) makes the table fail.
SLIPS = {
    "relative": "from ..runtime.worker import transport",
    "bare package": "from testbed import runtime",
    "import testbed.x": "import testbed.runtime",
    "importlib literal": "import importlib\nimportlib.import_module('testbed.runtime.wire')",
    "__import__ literal": "__import__('testbed.net.network')",
}


@pytest.mark.parametrize("slip", sorted(SLIPS))
def test_a_planted_crossing_fails_in_any_form(tmp_path: Path, slip: str) -> None:
    shutil.copytree(ROOT / "testbed", tmp_path / "testbed",
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert not crossings_not_in_the_table(tmp_path)
    path = tmp_path / "testbed" / "sim" / "network.py"
    path.write_text(path.read_text() + "\n" + SLIPS[slip] + "\n")
    bad = crossings_not_in_the_table(tmp_path)
    assert len(bad) == 1 and bad[0].startswith("testbed/sim/network.py:"), bad
