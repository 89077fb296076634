"""The documentation: every measured table is what its JSON renders (scripts/docs_tables.py),
with the commit that measured it under it; the README stays a five-minute read that links
to the pages."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _docs_tables() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_tables",
                                                  ROOT / "scripts" / "docs_tables.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_tables"] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


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
    assert "scripts/setup && .venv/bin/testbed up topologies/paper-3dc.yaml -p atlas" in readme
    assert "scripts/setup && scripts/check" in readme
    assert ".venv/bin/mkdocs serve" in readme

