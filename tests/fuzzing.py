"""Mutations of real input files, and the check every mutation must pass: the CLI either
accepts the file or says what is wrong in one line with exit code 2, never a traceback, and
leaves nothing behind. Shared by tests/test_fuzz.py and scripts/soak.py."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from testbed.cli.main import main

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["-40ms", "1e400ms", "40 lightyears", "NaN", "inf", "0", "1%", "200%",
                     "10Gbit", "east", "east-west", "a" * 300, "../../etc", "x;rm -rf /",
                     "$(id)", "\x00", "1/s", "-3", "1e9", "[", "{a: 1}"]),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(-2, 2), max_size=2),
)


def paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into nested dicts and lists, containers included."""
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out += paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out += paths(value, (*prefix, i))
    return out


@st.composite
def mutated_data(draw: st.DrawFn, data: Any, rounds: int = 3) -> Any:
    """`data` with a few random edits: a value replaced, a key dropped or added, an item
    duplicated."""
    data = copy.deepcopy(data)
    for _ in range(draw(st.integers(1, rounds))):
        targets = [p for p in paths(data) if p]
        if not targets:
            return draw(JUNK)
        path = draw(st.sampled_from(targets))
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        last = path[-1]
        action = draw(st.sampled_from(["replace", "delete", "add", "duplicate"]))
        if action == "replace":
            parent[last] = draw(JUNK)
        elif action == "delete":
            del parent[last]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(JUNK)
        elif isinstance(parent, list):
            parent.append(copy.deepcopy(parent[last]))
        else:
            parent[last] = [parent[last], parent[last]]
    return data


@st.composite
def mutated_text(draw: st.DrawFn, text: str, rounds: int = 4) -> str:
    """`text` with characters inserted, deleted or replaced, or lines dropped or repeated."""
    for _ in range(draw(st.integers(1, rounds))):
        lines = text.splitlines(keepends=True)
        action = draw(st.sampled_from(["insert", "delete", "replace", "drop", "repeat"]))
        if action in ("drop", "repeat") and lines:
            i = draw(st.integers(0, len(lines) - 1))
            lines[i:i + 1] = [] if action == "drop" else [lines[i], lines[i]]
            text = "".join(lines)
            continue
        at = draw(st.integers(0, len(text)))
        piece = draw(st.sampled_from([":", "-", ",", "\n", " ", "[", "{", "'", '"', "#", "\t",
                                      "0", "x", "\\", "\x00", "é", "\ufeff", "*a", "&a", "!!"]))
        if action == "insert":
            text = text[:at] + piece + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)):]
        else:
            text = text[:at] + piece + text[at + 1:]
    return text


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def cli_rejects_cleanly_or_accepts(argv: list[str], named: str, watch: Path) -> int:
    """Run the CLI in this process; return its exit code after checking the contract:
    0, or 2 with one line naming `named`; no traceback; on an error, `watch` unchanged."""
    before = tree(watch)
    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exc:
            code = exc.code
    message = err.getvalue()
    assert "Traceback" not in message, message
    assert code in (0, None, 2), f"exit {code}: {message}"
    if code == 2:
        lines = message.strip().splitlines()
        assert len(lines) == 1, message
        assert lines[0].startswith("testbed: error: "), message
        assert named in lines[0], message
        assert tree(watch) == before, "an input error left files behind"
        return 2
    return 0


def write(path: Path, data: Any, as_json: bool = False) -> None:
    """Write data (YAML via our own writer, or JSON) or text."""
    from testbed.common.yamlio import to_yaml

    if isinstance(data, str):
        path.write_text(data, errors="surrogatepass")
    elif as_json:
        path.write_text(json.dumps(data, allow_nan=True))
    else:
        try:
            path.write_text(to_yaml(data))
        except Exception:  # data our writer cannot express: fall back to JSON (also YAML)
            path.write_text(json.dumps(data, allow_nan=True, default=str))

