"""The architecture as a table: which part of the package imports which. A part is a
folder of testbed/, and under emulator/ each of its folders (the WAN, net/; runtime's four:
the wire between the processes, the worker, the coordinator, `testbed launch`) with its
own modules (backend, resumption) the part `emulator`; the simulator's backend
(sim/backend.py) is a part of its own, above the run it is a backend of, as the emulator's
is. Lazy imports inside functions and
dynamic imports count too, since they bind the parts as surely as imports at the top of a
module. The table holds the crossings the design makes and no more: a new one is a
decision, made by adding it here. Imports are read by tests/import_reader.py, which
test_layering.py shares."""

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
    # a run, whichever backend runs it: below both, so it imports neither (what it needs of
    # the simulator, planning again after a failure or the emulator's prediction, it is
    # handed: testbed.policy.registry.Planner, testbed.run.prediction.Prediction)
    "run": {"common", "inference", "job", "metrics", "plan", "policy", "report", "scenario",
            "topology"},
    # the two backends, siblings above run/: the simulator, then its backend (sim/backend.py)
    "sim": {"common", "inference", "job", "metrics", "plan", "policy", "scenario",
            "topology"},
    "sim.backend": {"common", "inference", "job", "metrics", "plan", "policy", "report", "run",
                    "sim"},
    # the emulator: its WAN, its processes (runtime's four), then its backend and resumption
    "emulator.net": {"common", "plan", "topology"},
    "emulator.runtime.wire": {"common", "job", "plan", "scenario"},
    "emulator.runtime.worker": {"common", "emulator.net", "emulator.runtime.wire", "job", "plan",
                                "run", "scenario", "topology"},
    "emulator.runtime.coordinator": {"common", "emulator.net", "emulator.runtime.wire",
                                     "emulator.runtime.worker", "inference", "job", "metrics",
                                     "plan", "policy", "run", "scenario", "topology"},
    "emulator.runtime.launch": {"common", "emulator.net", "emulator.runtime.coordinator",
                                "emulator.runtime.wire", "emulator.runtime.worker", "job",
                                "metrics", "policy", "report", "scenario", "topology"},
    "emulator": {"common", "emulator.runtime.coordinator", "emulator.runtime.worker",
                 "inference", "job", "metrics", "plan", "policy", "report", "run",
                 "topology"},
    # above both backends: what picks one and hands the emulator the simulator's prediction
    # (run.py), the planning entry that wires the simulator into a policy's planning
    # (planning.py); emulator.net: a sweep marks its worker processes so that `testbed
    # down` finds what a killed sweep leaves (emulator.net.sweep_leftovers)
    "experiments": {"common", "emulator", "emulator.net", "inference", "job", "metrics", "plan",
                    "policy", "report", "run", "scenario", "sim", "sim.backend", "topology"},
    # a claim measured on either backend: one transfer over a pair of emulated DCs at the
    # dilation this machine needs (emulator.net, emulator.runtime.coordinator's capacity
    # probe, run.dilation), or in the simulator (sim.one_transfer)
    "figures": {"common", "emulator.net", "emulator.runtime.coordinator", "experiments", "job",
                "metrics", "plan", "policy", "report", "run", "sim", "topology"},
    "api": {"common", "experiments", "metrics", "plan", "policy", "report", "run"},
    # the commands: the emulated WAN alone (`net`, `down`), `launch` (and `show` of its
    # results), `up --resume` (emulator.resume)
    "cli": {"api", "common", "emulator", "emulator.net", "emulator.runtime.launch",
            "experiments", "figures", "metrics", "plan", "policy", "report", "run",
            "topology"},
}
EVERYWHERE = {"errors", "__init__"}
GROUPS = {"emulator.runtime": {"emulator.runtime.wire", "emulator.runtime.worker",
                               "emulator.runtime.coordinator", "emulator.runtime.launch"}}
"""A folder split into parts: importing it bare (`from testbed.emulator import runtime`)
reaches every one of them."""


def part(module: str) -> str:
    """The longest row or group that holds `module`, else its folder:
    testbed.emulator.runtime.worker.transport.transport -> emulator.runtime.worker;
    testbed.emulator.net.shaping -> emulator.net; testbed.emulator.backend -> emulator;
    testbed.sim.network -> sim; testbed.sim.backend -> sim.backend; testbed.api -> api;
    testbed -> __init__."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__"
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in MAY_IMPORT or name in GROUPS:
            return name
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


def folders_without_a_place(root: Path) -> list[str]:
    """Folders of testbed/ holding code that are neither a row, a group nor one of the
    worker's folders: a new folder inside a part would otherwise be read as that part
    and take its row's imports unseen."""
    placed = set(MAY_IMPORT) | set(GROUPS) | {
        f"emulator.runtime.worker.{f}" for f in WORKER_FOLDERS if f}
    package = root / "testbed"
    return sorted(
        name for path in package.rglob("*.py") if "__pycache__" not in path.parts
        and (name := ".".join(path.parent.relative_to(package).parts))
        and name not in placed)


def test_every_folder_is_a_part_or_a_named_folder_of_one() -> None:
    assert not folders_without_a_place(ROOT)


def test_a_planted_folder_inside_a_part_fails(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "testbed", tmp_path / "testbed",
                    ignore=shutil.ignore_patterns("__pycache__"))
    planted = tmp_path / "testbed" / "emulator" / "extra"
    planted.mkdir()
    (planted / "__init__.py").write_text('"""A folder nobody placed."""\n')
    assert folders_without_a_place(tmp_path) == ["emulator.extra"]


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
    """Nor the run it is a backend of: only its backend (sim/backend.py) does."""
    assert not any(p.startswith("emulator") or p in {"run", "sim.backend"}
                   for p in MAY_IMPORT["sim"])
    assert not any(p.startswith("emulator") for p in MAY_IMPORT["sim.backend"])


def test_the_backends_are_siblings() -> None:
    """Neither backend imports the other, and the run both run imports neither: what the
    emulator needs of the simulator (its prediction, planning again) its caller hands it."""
    emulator = [row for source, row in MAY_IMPORT.items() if source.startswith("emulator")]
    assert not any(p.startswith("sim") for row in emulator for p in row)
    assert not any(p.startswith(("sim", "emulator")) for p in MAY_IMPORT["run"])


WORKER = "testbed.emulator.runtime.worker"
WORKER_FOLDERS: dict[str, set[str]] = {
    "transport": set(),
    "collectives": set(),
    "compute": {"collectives"},
    "": {"collectives", "compute", "transport"},
}
"""Inside the worker's part, its folders, lowest first, and which each imports: "" is the
worker's own modules (its processes, the stage's data plane), which put the three
together."""


def worker_folder(module: str) -> str:
    rest = module.removeprefix(WORKER).lstrip(".").split(".")[0]
    return rest if rest in WORKER_FOLDERS else ""


def worker_crossings_not_in_the_table(root: Path) -> list[str]:
    found = {n: p for n, p in modules(root).items() if n.partition(".")[0] == "testbed"}
    bad = []
    for name, path in found.items():
        if part(name) != "emulator.runtime.worker":
            continue
        source = worker_folder(name)
        for imp in read(name, path, found):
            target = owner(imp.module, found)
            if target is None or part(target) != "emulator.runtime.worker":
                continue
            to = worker_folder(target)
            if to != source and to not in WORKER_FOLDERS[source]:
                bad.append(f"{path.relative_to(root)}:{imp.line}: worker/{source} imports "
                           f"worker/{to}")
    return bad


def test_the_worker_folders_import_downward_only() -> None:
    order = list(WORKER_FOLDERS)
    upward = [f"{source} -> {to}" for source, row in WORKER_FOLDERS.items() for to in row
              if to not in order[: order.index(source)]]
    assert not upward, upward
    bad = worker_crossings_not_in_the_table(ROOT)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("line", [
    "from testbed.emulator.runtime.worker.compute import zeros",
    "from testbed.emulator.runtime.worker import stage_runner",
])
def test_a_planted_upward_worker_import_fails(tmp_path: Path, line: str) -> None:
    shutil.copytree(ROOT / "testbed", tmp_path / "testbed",
                    ignore=shutil.ignore_patterns("__pycache__"))
    path = tmp_path / "testbed" / "emulator" / "runtime" / "worker" / "collectives" / "syncs.py"
    path.write_text(path.read_text() + "\n" + line + "\n")
    bad = worker_crossings_not_in_the_table(tmp_path)
    assert len(bad) == 1 and "collectives/syncs.py:" in bad[0], bad


# Every form an import takes is read: each planted in a copy of the simulator's flow model
# (which must not reach the emulator's runtime) makes the table fail.
SLIPS = {
    "relative": "from ..emulator.runtime.worker import transport",
    "bare package": "from testbed.emulator import runtime",
    "import testbed.x": "import testbed.emulator.runtime",
    "importlib literal":
        "import importlib\nimportlib.import_module('testbed.emulator.runtime.wire')",
    "__import__ literal": "__import__('testbed.emulator.net.network')",
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
