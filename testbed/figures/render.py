"""claims.json, a table per claim with its runs (figures.md), a PNG per claim, and the
README's "Paper claims" table, all from the claim records."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from testbed.figures.claims import BACKENDS
from testbed.figures.collect import ClaimRecord
from testbed.fsutil import write_atomic
from testbed.report.figure_files import save_figure

README_BEGIN = "<!-- paper-claims:begin (testbed figures --readme README.md) -->"
README_END = "<!-- paper-claims:end -->"
HATCHES = ("", "//", "xx", "..", "\\\\", "oo")


def load_records(path: Path) -> list[ClaimRecord]:
    """Records a previous invocation wrote, or none."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
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
    """The README's table: one row per claim and conditions."""
    lines = ["| claim | paper | ours, simulated | ours, emulated | conditions |",
             "| --- | --- | --- | --- | --- |"]
    for r in records:
        cells = [f"{fmt(_value(r, b), r['unit'])}{_verdict(r, b)}"
                 if _value(r, b) is not None or b not in r["not_run"] else "not run"
                 for b in BACKENDS]
        lines.append(f"| {r['claim']} | {r['paper']} | {cells[0]} | {cells[1]} | "
                     f"`{r['conditions']}` |")
    return "\n".join(lines)


def details_markdown(records: Sequence[ClaimRecord]) -> str:
    """Every claim with the runs behind it, per backend."""
    out = ["# The paper's claims, measured", "", claims_table(records), ""]
    for r in records:
        out += [f"## {r['claim']} ({r['id']})", "", f"Paper: {r['paper']}. Conditions: "
                f"`{r['conditions']}` ({r['conditions_summary']}).", "",
                f"Reproduce: `{r['command']}`", ""]
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


def _columns(rows: dict[str, dict[str, Any]]) -> list[str]:
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


def plot(record: ClaimRecord, path: Path) -> None:
    """Per backend, the measured quantity of each run (or transfer) behind the claim."""
    panels = [(b, record["detail"][b]) for b in BACKENDS if b in record["detail"]]
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.5 * max(1, len(panels)), 3.6),
                             squeeze=False)
    for ax, (backend, figures) in zip(axes[0], panels, strict=False):
        labels, values, ylabel = _bars(record, figures.get("runs", {}))
        ax.bar(range(len(values)), values, color="white", edgecolor="black",
               hatch=[HATCHES[i % len(HATCHES)] for i in range(len(values))])
        ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(ylabel)
        ax.set_title(f"{backend}: {fmt(figures.get('value'), record['unit'])}", fontsize=10)
        ax.grid(True, axis="y", color="0.85")
    fig.suptitle(f"{record['claim']}\n{record['conditions']}", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)


def _bars(record: ClaimRecord, runs: dict[str, dict[str, Any]]
          ) -> tuple[list[str], list[float], str]:
    if "transfer" in runs:
        t = runs["transfer"]
        labels = ["1 connection", f"{t['connections']} connections"]
        values = [t["one_connection_s"], t["many_connections_s"]]
        if t.get("many_connections_paced_s") is not None:
            labels.append(f"{t['connections']}, paced")
            values.append(t["many_connections_paced_s"])
        return labels, values, "transfer time (s)"
    if record["unit"] == "of linear":
        return (list(runs), [r.get("tokens_per_s") or 0.0 for r in runs.values()], "tokens/s")
    if record["unit"] == "%":
        if record["id"].startswith("bubbles_after"):
            return (list(runs), [100 * (1 - (r.get("utilization_training") or 0.0))
                                 for r in runs.values()], "idle GPU time (%)")
        if not record["at_most"]:
            return (list(runs), [100 * (r.get("utilization_total") or 0.0)
                                 for r in runs.values()], "GPU utilization (%)")
    return (list(runs), [r.get("iteration_s") or 0.0 for r in runs.values()],
            "iteration time (s)")


def has_markers(readme: Path) -> bool:
    text = readme.read_text()
    return README_BEGIN in text and text.find(README_END) > text.find(README_BEGIN)


def update_readme(readme: Path, records: Sequence[ClaimRecord]) -> None:
    """Replace the table between the markers (which must be there)."""
    text = readme.read_text()
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        raise ValueError(f"{readme}: no {README_BEGIN} ... {README_END} section to replace")
    new = text[: start + len(README_BEGIN)] + "\n" + claims_table(records) + "\n" + text[end:]
    write_atomic(readme, new, 0o644)
