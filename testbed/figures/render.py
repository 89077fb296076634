"""claims.json, a table per claim with its runs (figures.md), a PNG per claim, and the
documentation's "Paper claims" table (docs/claims.md), all from the claim records."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.common.fsutil import write_atomic, write_named
from testbed.common.jsonio import read_json
from testbed.figures.claim_runs import ClaimRun
from testbed.figures.claims import BACKENDS
from testbed.figures.collect import ClaimRecord

MARKERS = "<!-- paper-claims:begin --> ... <!-- paper-claims:end -->"
"""Where the table goes in a Markdown file (the begin marker may name a command)."""
_BLOCK = re.compile(r"<!-- paper-claims:begin(?: \([^)\n]*\))? -->\n(.*?)"
                    r"<!-- paper-claims:end -->", re.S)


def load_records(path: Path) -> list[ClaimRecord]:
    """Records a previous invocation wrote, or none."""
    if not path.exists():
        return []
    data = read_json(path)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of claims")
    return data


def write_records(path: Path, records: Sequence[ClaimRecord]) -> None:
    write_atomic(path, json.dumps(list(records), indent=1) + "\n", 0o644)


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "x":
        return f"{value:.2f}x"
    if unit == "%":
        return f"{value:.1f}%"
    return f"{value:.2f}"


def _value(record: ClaimRecord, backend: str) -> float | None:
    return record["simulate"] if backend == "simulate" else record["emulate"]


def _verdict(record: ClaimRecord, backend: str) -> str:
    value, target = _value(record, backend), record["target"]
    if value is None or target is None:
        return ""
    met = value <= target if record["at_most"] else value >= target
    return "" if met else " (below target)" if not record["at_most"] else " (above target)"


def claims_table(records: Sequence[ClaimRecord]) -> str:
    """The documentation's table: one row per claim and conditions, with the largest figure the
    search of the design space found and where."""
    lines = ["| claim | paper | ours, simulated | ours, emulated | conditions | "
             "up to, simulated (where) |", "| --- | --- | --- | --- | --- | --- |"]
    for r in records:
        cells = [f"{fmt(_value(r, b), r['unit'])}{_verdict(r, b)}"
                 if _value(r, b) is not None or b not in r["not_run"] else "not run"
                 for b in BACKENDS]
        lines.append(f"| {r['claim']} | {r['paper']} | {cells[0]} | {cells[1]} | "
                     f"`{r['conditions']}` | {up_to_text(r)} |")
    return "\n".join(lines)


def up_to_text(record: ClaimRecord) -> str:
    """`17.3x (reached; at one-way 150 ms, 100 Gbit/s)`, or `-` before a search."""
    up_to = record.get("up_to")
    if not up_to or up_to.get("value") is None:
        return "-"
    return f"{fmt(up_to['value'], record['unit'])} ({verdict(record)}at {up_to['conditions']})"


def verdict(record: ClaimRecord) -> str:
    """Whether the search's figure reaches the target; for a cost (at most), its largest
    is the worst found, which must stay within the target."""
    up_to = record.get("up_to")
    reached = up_to.get("reached") if up_to else None
    if record["at_most"]:
        return "" if reached is None else "worst found, within target; " if reached else \
            "worst found, above target; "
    return "" if reached is None else "reached; " if reached else "below target; "


def bounds_list(records: Sequence[ClaimRecord]) -> str:
    """What bounds each figure at its conditions (`why`), one line per claim and
    conditions, for under the table."""
    return "\n".join(f"- {r['claim']} (`{r['conditions']}`): {r['why']}."
                     for r in records if r.get("why"))


def details_markdown(records: Sequence[ClaimRecord]) -> str:
    """Every claim with the runs behind it, per backend."""
    out = ["# The paper's claims, measured", "", claims_table(records), ""]
    for r in records:
        out += [f"## {r['claim']} ({r['id']})", "", f"Paper: {r['paper']}. Conditions: "
                f"`{r['conditions']}` ({r['conditions_summary']}).", "",
                f"Reproduce: `{r['command']}`", ""]
        if r.get("why"):
            out += [f"What bounds it: {r['why']}.", ""]
        up_to = r.get("up_to")
        if up_to:
            out += [f"Up to, searched in the simulator ({up_to['points']} points, "
                    f"{up_to['search']} search; heat map "
                    f"`frontier-{r['id'].partition(':')[0]}.png`): {up_to_text(r)}"
                    + (f". There: {up_to['why']}." if up_to.get("why") else "."), ""]
        for backend in BACKENDS:
            figures = r["detail"].get(backend)
            if figures is None:
                out += [f"{backend}: {r['not_run'].get(backend, 'not run')}", ""]
                continue
            out += [f"{backend}: **{fmt(figures.get('value'), r['unit'])}**"
                    + (f" ({figures['why_none']})" if figures.get("why_none") else ""), ""]
            rows = figures.get("runs", {})
            if rows:
                keys = _columns(rows)
                out.append("| run | " + " | ".join(keys) + " |")
                out.append("| --- |" + " --- |" * len(keys))
                for name, row in rows.items():
                    out.append(f"| {name} | " + " | ".join(_cell(row.get(k)) for k in keys)
                               + " |")
                out.append("")
    return "\n".join(out)


def _columns(rows: dict[str, ClaimRun]) -> list[str]:
    seen: dict[str, None] = {}
    for row in rows.values():
        for key, value in row.items():
            if value is not None:
                seen.setdefault(key)
    return list(seen)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def claims_block(records: Sequence[ClaimRecord]) -> str:
    """What goes between the markers: the table, then what bounds each figure."""
    bounds = bounds_list(records)
    return claims_table(records) + ("\n\nWhat bounds each figure, computed from its "
                                    "simulated runs:\n\n" + bounds if bounds else "")


def has_markers(page: Path) -> bool:
    return _BLOCK.search(page.read_text(encoding="utf-8", errors="replace")) is not None


def update_markdown(page: Path, records: Sequence[ClaimRecord]) -> None:
    """Replace the table between the markers of a Markdown file the user named (which
    must be there); the begin marker stays as written."""
    text = page.read_text(encoding="utf-8")
    found = _BLOCK.search(text)
    if found is None:
        raise ValueError(f"{page}: no {MARKERS} section to replace")
    new = text[: found.start(1)] + claims_block(records) + "\n" + text[found.end(1):]
    write_named(page, new, "--readme")
