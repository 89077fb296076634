"""The documentation: every measured table is what its JSON renders (scripts/docs_tables.py),
with the commit that measured it under it; the README stays a five-minute read that links
to the pages."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import pytest

from .scripts import script

ROOT = Path(__file__).resolve().parent.parent


def _docs_tables() -> ModuleType:
    return script("docs_tables")


def test_every_measured_table_is_what_its_json_renders(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = _docs_tables().main(["--check"])
    assert code == 0, capsys.readouterr().err


@pytest.fixture
def tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """docs_tables on a repository of its own: one page, one JSON, one table of it."""
    module = _docs_tables()
    (tmp_path / "docs").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "speed.json").write_text(json.dumps({"tokens_per_s": 4566}))
    (tmp_path / "docs" / "page.md").write_text(
        "# Speed\n\nMeasured:\n\n<!-- speed:begin (scripts/docs_tables.py) -->\nby hand\n"
        "<!-- speed:end -->\n\nAfter.\n")
    (tmp_path / "docs" / "measurements.md").write_text(
        "# Measurements\n\n<!-- measurements:begin -->\n<!-- measurements:end -->\n")

    def speed(report: dict[str, Any]) -> str:
        return f"| tokens/s |\n| --- |\n| {report['tokens_per_s']:,} |"

    monkeypatch.setattr(module, "ROOT", tmp_path)
    monkeypatch.setattr(module, "DOCS", tmp_path / "docs")
    monkeypatch.setattr(module, "TABLES", {
        module.INDEX: module.TABLES[module.INDEX],
        "speed": module.Table(("benchmarks/speed.json",), speed, "scripts/bench_speed.py")})
    return module


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c",
                           "user.email=t@example.com", *args], check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_table_is_rendered_from_its_json_and_checked_against_it(
        tables: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "docs" / "page.md"
    assert tables.main(["--check"]) == 1  # "by hand" is not what the JSON renders
    assert "by hand" in page.read_text()  # --check changes nothing
    assert "docs/page.md: speed (from benchmarks/speed.json)" in capsys.readouterr().err
    assert tables.main([]) == 0
    text = page.read_text()
    assert "| 4,566 |" in text and "by hand" not in text
    assert text.startswith("# Speed\n\nMeasured:\n\n<!-- speed:begin (scripts/docs_tables.py)")
    assert text.endswith("<!-- speed:end -->\n\nAfter.\n")
    assert "| speed | [Speed](page.md) | `scripts/bench_speed.py` | `benchmarks/speed.json` |" \
        in (tmp_path / "docs" / "measurements.md").read_text()
    assert tables.main(["--check"]) == 0
    (tmp_path / "benchmarks" / "speed.json").write_text(json.dumps({"tokens_per_s": 10083}))
    assert tables.main(["--check"]) == 1
    assert tables.main([]) == 0 and "| 10,083 |" in page.read_text()


def test_the_stamp_names_the_commit_that_measured_the_json(
        tables: ModuleType, tmp_path: Path) -> None:
    page = tmp_path / "docs" / "page.md"
    tables.main([])
    assert "*Measured at a commit unknown here (no git) (`benchmarks/speed.json`).*" \
        in page.read_text()
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "benchmarks")
    _git(tmp_path, "commit", "-q", "-m", "measured")
    measured = _git(tmp_path, "rev-parse", "HEAD")[:10]
    tables.main([])
    _git(tmp_path, "add", "docs")
    _git(tmp_path, "commit", "-q", "-m", "the pages")  # a later commit not touching the JSON
    assert f"*Measured at commit {measured} (`benchmarks/speed.json`).*" in page.read_text()
    assert tables.main(["--check"]) == 0
    (tmp_path / "benchmarks" / "speed.json").write_text(json.dumps({"tokens_per_s": 1}))
    tables.main([])
    assert "not committed" in page.read_text()
    (tmp_path / "benchmarks" / "speed.json").write_text(
        json.dumps({"tokens_per_s": 1, "commit": "abc1234"}))
    tables.main([])
    assert "*Measured at commit abc1234 (`benchmarks/speed.json`).*" in page.read_text()


def test_an_unknown_or_missing_table_is_refused(tables: ModuleType, tmp_path: Path) -> None:
    page = tmp_path / "docs" / "page.md"
    text = page.read_text()
    page.write_text(text + "<!-- nonsense:begin -->\n<!-- nonsense:end -->\n")
    with pytest.raises(SystemExit, match=re.escape("docs/page.md: no table is named 'nonsense'")):
        tables.main(["--check"])
    page.write_text("# Speed\n")
    with pytest.raises(SystemExit, match="no page holds the table"):
        tables.main(["--check"])



def test_the_readme_is_a_five_minute_read_that_links_to_the_pages() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 300
    linked = set(re.findall(r"\]\(docs/([a-z-]+\.md)(?:#[a-z0-9-]+)?\)", readme))
    pages = {path.name for path in (ROOT / "docs").glob("*.md")}
    assert linked and linked <= pages
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert pages == set(re.findall(r"^ *- [^:]+: ([a-z-]+\.md)$", nav, re.M))
    assert "scripts/setup && . .venv/bin/activate && testbed up topologies/paper-3dc.yaml " \
        "-p atlas\nscripts/setup && scripts/check\n" in readme
    assert "mkdocs serve" in readme



# The docs' commands, as a user pastes them: every `testbed` command of a page's shell
# blocks (continuation lines joined, comments dropped, `&&` and `;` splitting a line), and
# every inline `testbed ...` span that names no placeholder (TOPO, [--opt], a|b, ...).
# Each parses with the command's own click parser (every option known, every value of its
# type or choice, every shipped file it names present); those that run in seconds in the
# simulator (plan, plugins, validate, simulate, results schema) also run for real, pasted
# verbatim into bash with the virtual environment's bin on PATH, as getting-started.md
# says to put it. The rest (the emulator, compare, sweep and figures, minutes each, or
# commands after a `pip install` of one's own package) parse only.
PAGES = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md")),
         ROOT / "examples" / "testbed-example-policy" / "README.md"]
FENCE = re.compile(r"^```(?P<lang>[a-z]*)\n(?P<body>.*?)^```", re.M | re.S)
SHELLS = {"", "sh", "bash", "shell", "console"}
STARTS_COMMAND = re.compile(r"(?:^|&&|\|\||;)\s*testbed\s")
PLACEHOLDER = re.compile(r"[\[\]|]|\.\.\.|(?<![\w./=-])[A-Z][A-Z0-9_]*(?![\w./=-])")
RUNS = {("plan",), ("plugins",), ("validate",), ("simulate",), ("results", "schema")}
SHIPPED = ("topologies/", "scenarios/", "examples/")


@dataclass(frozen=True)
class DocCommand:
    where: str
    line: str
    """The shell line as the page has it (continuations joined)."""
    argv: tuple[str, ...]
    """One `testbed` command of it: `testbed` and its arguments."""


@dataclass(frozen=True)
class ShellBlock:
    where: str
    commands: tuple[DocCommand, ...]
    installs: bool
    """It installs a package first (`pip install`): its commands need that package."""


def _testbed_commands(where: str, line: str) -> list[DocCommand]:
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    for token in lexer:
        if set(token) <= set(";&|"):
            commands.append([])
        else:
            commands[-1].append(token)
    return [DocCommand(where, line, tuple(argv)) for argv in commands
            if argv and argv[0] == "testbed"]


def shell_blocks() -> list[ShellBlock]:
    blocks = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for k, fence in enumerate(FENCE.finditer(text)):
            if fence["lang"] not in SHELLS:
                continue
            where = f"{page.relative_to(ROOT)}#{k}"
            lines = re.sub(r"\s*\\\n\s*", " ", fence["body"]).splitlines()
            commands = [command for line in lines if STARTS_COMMAND.search(line)
                        for command in _testbed_commands(where, line.strip())]
            if commands:
                blocks.append(ShellBlock(where, tuple(commands),
                                         "pip install" in fence["body"]))
    return blocks


def inline_commands() -> list[DocCommand]:
    found = []
    for page in PAGES:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        for span in re.findall(r"`(testbed\s[^`]*)`", text):
            line = " ".join(span.split())
            if not PLACEHOLDER.search(line):
                found += _testbed_commands(str(page.relative_to(ROOT)), line)
    return list(dict.fromkeys(found))


@pytest.fixture
def parse_only(monkeypatch: pytest.MonkeyPatch,
               tmp_path: Path) -> Callable[[DocCommand, bool], None]:
    """Parse a command with testbed's click commands, their bodies replaced by a recorder,
    in a directory holding the repository's shipped files (as its root does)."""
    from testbed.cli.main import cli

    reached: list[str] = []

    def leaves(group: click.Group) -> Iterator[click.Command]:
        for command in group.commands.values():
            if isinstance(command, click.Group):
                yield from leaves(command)
            else:
                yield command

    for command in leaves(cli):
        monkeypatch.setattr(command, "callback",
                            lambda *_a, _name=command.name, **_k: reached.append(_name))
    for shipped in SHIPPED:
        (tmp_path / shipped).symlink_to(ROOT / shipped)
    monkeypatch.chdir(tmp_path)

    def parse(command: DocCommand, whole: bool) -> None:
        for arg in command.argv:
            if arg.startswith(SHIPPED):
                assert (ROOT / arg).exists(), f"{command.where}: {arg} is not in the repository"
        reached.clear()
        try:
            cli.main(args=list(command.argv[1:]), prog_name="testbed", standalone_mode=False)
        except click.MissingParameter:
            assert not whole, f"{command.where}: {command.line}"  # inline: names a command
            return
        except click.UsageError as error:
            assert not whole and "Missing command" in str(error), \
                f"{command.where}: {command.line}: {error}"
            return
        assert reached, f"{command.where}: {command.line} reaches no command"

    return parse


def _runs(command: DocCommand, block: ShellBlock) -> bool:
    words = tuple(arg for arg in command.argv[1:3] if not arg.startswith("-"))
    alone = len(_testbed_commands(block.where, command.line)) == 1 \
        and command.line.startswith("testbed ")
    return alone and not block.installs and any(words[:len(r)] == r for r in RUNS)


def test_the_docs_commands_are_found() -> None:
    """The extraction finds what the pages show (the checks below are not vacuous)."""
    lines = {command.line for block in shell_blocks() for command in block.commands}
    assert "testbed simulate topologies/two-dc.yaml --plan p.csv" in lines
    assert any(line.startswith("testbed up topologies/two-dc.yaml -p diloco -o inner_steps=4 "
                               "--compute real --iterations 64") for line in lines)
    assert "scripts/setup" not in {c.argv[0] for b in shell_blocks() for c in b.commands}
    inline = {command.line for command in inline_commands()}
    assert "testbed plan topologies/gpt3-4dc.yaml -p atlas -o search=grid" in inline
    assert not any("TOPO" in line or "[" in line for line in inline)


@pytest.mark.parametrize("block", shell_blocks(), ids=lambda block: block.where)
def test_every_shell_block_of_the_docs_works_as_pasted(
        block: ShellBlock, parse_only: Callable[[DocCommand, bool], None],
        tmp_path: Path) -> None:
    """After the one PATH step of getting-started.md, in the repository's root."""
    env = {**os.environ, "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                  os.environ.get("PATH", "")])}
    for command in block.commands:
        parse_only(command, True)
        if _runs(command, block):
            ran = subprocess.run(["bash", "-c", command.line], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=300)
            assert ran.returncode == 0, f"{block.where}: {command.line}\n{ran.stderr}"
            assert "Traceback" not in ran.stderr


@pytest.mark.parametrize("command", inline_commands(),
                         ids=lambda command: f"{command.where}:{' '.join(command.argv[1:3])}")
def test_every_inline_command_of_the_docs_parses(
        command: DocCommand, parse_only: Callable[[DocCommand, bool], None]) -> None:
    parse_only(command, False)


def test_one_path_step_comes_first_and_every_page_spells_commands_after_it() -> None:
    """A command pasted from the docs into a fresh shell finds `testbed` once the quick
    start's one step has put `.venv/bin` on PATH: the README and getting-started.md take
    that step before their first command, and no page spells a `.venv/bin/` path for a
    command that step puts on PATH (`.venv/bin/python scripts/...` works either way)."""
    for page in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        text = page.read_text(encoding="utf-8")
        first = FENCE.search(text[text.index("## Quick start"):])
        assert first is not None
        lines = first["body"].splitlines()
        assert lines == ["scripts/setup && . .venv/bin/activate && testbed up "
                         "topologies/paper-3dc.yaml -p atlas",
                         "scripts/setup && scripts/check"], page
        assert lines[1] in (ROOT / ".ci" / "run").read_text().splitlines()  # CI runs it
        assert "export PATH=$PWD/.venv/bin:$PATH" in " ".join(text.split())
    for page in PAGES:
        spelled = re.findall(r"\.venv/bin/(testbed|mkdocs|pytest|ruff|mypy)\b",
                             page.read_text(encoding="utf-8"))
        assert not spelled, (page.name, spelled)


def test_the_diloco_pages_commands_run_what_its_table_measured() -> None:
    """Each policy the DiLoCo page's simulate and compare commands run is a row of the
    simulated tables under them (scripts/bench_diloco.py's METHODS) with the same
    settings, defaults included: the command gives the figure the page shows."""
    from testbed.policy.registry import training_policy
    from testbed.policy.routing import options_for

    bench = script("bench_diloco")
    rows = [(policy, training_policy(policy, options).settings)
            for _, policy, options in bench.METHODS]
    checked = 0
    for block in shell_blocks():
        for command in block.commands:
            argv = command.argv
            if not block.where.startswith("docs/diloco.md") \
                    or argv[1] not in ("simulate", "compare"):
                continue
            after = {flag: [argv[k + 1] for k, arg in enumerate(argv[:-1]) if arg == flag]
                     for flag in ("-p", "-o")}
            for policy in after["-p"]:
                options = options_for(policy, after["-o"])
                settings = training_policy(policy, options).settings
                assert (policy, settings) in rows, \
                    f"{command.line}: {policy} {options} is no row of the page's table"
                checked += 1
    assert checked >= 5


@pytest.mark.slow
def test_the_api_pages_example_prints_what_its_page_shows() -> None:
    """The figures under docs/api.md's example come from that example: the benchmark
    measured the page's code as it is now, and the code, run again as the benchmark runs
    it, prints the same lines (the simulator is deterministic; the times are the
    benchmark's, with the load they were measured at)."""
    bench = script("bench_api_example")
    measured = json.loads((ROOT / "benchmarks" / "api-example.json").read_text())
    assert measured["code"] == bench.example(), "run scripts/bench_api_example.py again"
    assert bench.run_once(measured["code"])["printed"] == measured["printed"]
