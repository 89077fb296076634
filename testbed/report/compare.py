"""Comparing runs: one table row per policy combination over repeats, and flat CSV rows."""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from testbed.common.codec import JsonObject
from testbed.errors import one_line
from testbed.metrics.interval import Interval, mean_interval
from testbed.metrics.summary import speedup
from testbed.report.compare_loss import ToLoss, loss_notes, sort_key, to_loss
from testbed.report.run_figures import RunFigures
from testbed.report.table import aligned

EFFECTIVE = "effective tokens/s"
NOTE_CHARS = 300
"""A failed run's error as the table's note shows it, at most (compare.json has it all)."""


class CompareEntry(TypedDict):
    """A run as compare.json's `runs` hold it (RunEntry.as_dict)."""

    policy: str
    bubble_policy: str | None
    repeat: int
    directory: str
    status: str
    error: str | None
    results: JsonObject | None
    """Its results.json as read: raw (RunEntry.results)."""


@dataclass
class RunEntry:
    """One run inside a comparison."""

    policy: str
    bubble_policy: str | None
    repeat: int
    directory: str
    """Relative to the comparison's directory."""
    status: str
    error: str | None
    results: JsonObject | None
    """results.json as read: raw, for one written before the schema is read too; the
    table reads it through `figures`."""

    @property
    def combo(self) -> str:
        return self.policy if not self.bubble_policy else f"{self.policy}+{self.bubble_policy}"

    @property
    def figures(self) -> RunFigures | None:
        """What the table reads of its results, typed; None where it has none."""
        return None if self.results is None else RunFigures.of(self.results)

    def as_dict(self) -> CompareEntry:
        """The entry as compare.json holds it."""
        return {"policy": self.policy, "bubble_policy": self.bubble_policy,
                "repeat": self.repeat, "directory": self.directory, "status": self.status,
                "error": self.error, "results": self.results}


Cell = str | int | float | bool | None
"""A JSON scalar: one cell of compare.csv."""


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Cell]:
    """Nested results as one level of `a.b.c` keys; lists become JSON text (any JSON
    document: compare.csv has a column per key a run's results.json holds)."""
    out: dict[str, Cell] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}."))
        elif isinstance(value, list):
            out[name] = json.dumps(value)
        else:
            out[name] = value
    return out


def csv_text(entries: Sequence[RunEntry]) -> str:
    """One line per run, every results field a column but the long lists (placement, loss
    curve), which stay in each run's results.json."""
    rows = []
    for entry in entries:
        row = {"policy": entry.policy, "bubble_policy": entry.bubble_policy or "",
               "repeat": entry.repeat, "directory": entry.directory, "status": entry.status,
               "error": entry.error or ""}
        if entry.results is not None:
            flat = flatten(entry.results)
            flat.pop("plan.placement", None)
            flat.pop("loss_curve", None)  # a list per step: in the run's results.json
            flat.pop("synced_loss_curve", None)
            row.update({k: v for k, v in flat.items() if k not in row})
        rows.append(row)
    fields = list(dict.fromkeys(k for row in rows for k in row))
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


@dataclass
class Requests:
    """A row's inference requests, medians over repeats: how many arrived, were served
    (`expired`: of those, with the first token after the deadline) and were rejected."""

    arrived: float
    served: float
    rejected: float
    expired: float | None
    """None for runs written before it was counted."""

    def cells(self) -> list[str]:
        share = f" ({self.served / self.arrived:.0%})" if self.arrived else ""
        return [f"{self.served:.0f}/{self.arrived:.0f}{share}", f"{self.rejected:.0f}",
                _fmt(self.expired, "{:.0f}")]


def requests_of(ok: Sequence[RunFigures]) -> Requests | None:
    blocks = [r.inference for r in ok]
    if not any(b.get("requests") for b in blocks):
        return None

    def med(key: str) -> float | None:
        return _median([b.get(key) for b in blocks])

    return Requests(med("requests") or 0.0, med("served") or 0.0, med("rejected") or 0.0,
                    med("expired"))


@dataclass
class Row:
    combo: str
    runs: int
    failed: int
    iteration_s: float | None
    """The typical iteration (`typical_s`), median over repeats."""
    iteration_low: float | None
    iteration_high: float | None
    speedup: float | None
    tokens_per_s: float | None
    util_training: float | None
    util_total: float | None
    wan_util: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    error: str | None
    """Why the first of its failed runs failed, as one line; None when none failed."""
    requests: Requests | None = None
    """Inference requests, where the runs filled bubbles (or kept score without)."""
    slowdown: float | None = None
    """Training against the same policy with bubble policy `none`, by tokens/s (how much
    longer the same tokens take): the mean over repeats paired by number (the same
    seed), with its 95% interval from two on."""
    slowdown_interval: Interval | None = None
    predicted: float | None = None
    """Emulated runs: the simulator's iteration time for the same plan."""
    dilation: int | None = None
    machine_bound: bool = False
    """An emulated run whose pace this machine set (results' emulation.cpu_bound)."""
    to_loss: ToLoss | None = None
    """The time to the target loss over repeats; None when no target was given."""
    timed: int = 0
    """Runs with a typical iteration time: the spread is over them."""

    def spread_text(self) -> str:
        """`low-high` over repeats; `-` for a single one, which has no spread."""
        if self.timed < 2 or self.iteration_low is None or self.iteration_high is None:
            return "-"
        return f"{self.iteration_low:.3f}-{self.iteration_high:.3f}"

    def emulation_cells(self) -> list[str]:
        return [_fmt(self.predicted, "{:.3f}"), str(self.dilation or 1),
                "yes" if self.machine_bound else "no"]


def _median(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.median(kept) if kept else None


def table_rows(entries: Sequence[RunEntry]) -> list[Row]:
    """One row per policy combination, in first-seen order; spread is min..max over
    repeats of each run's typical iteration time; the speed-up is the row's tokens/s over
    the first row's (medians over repeats)."""
    combos = list(dict.fromkeys(e.combo for e in entries))
    rows: list[Row] = []
    for combo in combos:
        runs = [e for e in entries if e.combo == combo]
        ok = [f for e in runs if e.status == "ok" and (f := e.figures) is not None]
        medians = [r.typical_s for r in ok if r.typical_s is not None]
        failed = [e for e in runs if e.status != "ok"]
        rows.append(Row(
            combo=combo, runs=len(runs), failed=len(failed),
            iteration_s=_median(medians),
            iteration_low=min(medians) if medians else None,
            iteration_high=max(medians) if medians else None,
            speedup=None,
            tokens_per_s=_median([r.tokens_per_s for r in ok]),
            util_training=_median([r.util_training for r in ok]),
            util_total=_median([r.util_total for r in ok]),
            wan_util=_median([r.wan_util for r in ok]),
            ttft_p50=_median([r.ttft_p50 for r in ok]),
            ttft_p99=_median([r.ttft_p99 for r in ok]),
            error=_short(failed[0].error or failed[0].status) if failed else None,
            predicted=_median([r.predicted_s for r in ok]),
            dilation=max((r.dilation for r in ok), default=None),
            machine_bound=any(r.cpu_bound for r in ok),
            to_loss=to_loss(ok),
            requests=requests_of(ok),
            timed=len(medians),
        ))
    base = rows[0].tokens_per_s if rows else None
    by_combo = {row.combo: row for row in rows}
    if any(row.to_loss and not row.to_loss.default for row in rows):  # a target was given
        rows.sort(key=lambda row: sort_key(row.to_loss.time_s if row.to_loss else None))
    for row in rows:
        row.speedup = speedup(row.tokens_per_s, base)
        policy, plus, bubble = row.combo.partition("+")
        if plus and bubble != "none" and f"{policy}+none" in by_combo:
            paired = _paired_slowdowns(entries, row.combo, f"{policy}+none")
            if paired:
                row.slowdown_interval = mean_interval(paired)
                row.slowdown = row.slowdown_interval.mean
    return rows


def _paired_slowdowns(entries: Sequence[RunEntry], combo: str, reference: str) -> list[float]:
    """Per repeat number, the reference's tokens/s over the combination's - 1: how much
    longer the same tokens take."""
    def rates(name: str) -> dict[int, float]:
        return {e.repeat: rate for e in entries if e.combo == name and e.status == "ok"
                and (f := e.figures) is not None and (rate := f.tokens_per_s)}

    mine, base = rates(combo), rates(reference)
    return [base[k] / mine[k] - 1 for k in sorted(mine) if k in base]


def slowdown_text(row: Row) -> str:
    """The slowdown and its interval (Interval.percent), `-` where there is none."""
    if row.slowdown is None:
        return "-"
    if row.slowdown_interval is None:
        return f"{row.slowdown:+.2%}"
    return row.slowdown_interval.percent()


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def _short(error: str) -> str:
    line = one_line(error)
    return line if len(line) <= NOTE_CHARS else line[:NOTE_CHARS - 3] + "..."


def notes(rows: Sequence[Row]) -> list[str]:
    """Why a row shows `failed` or `-`: each failed run's reason (the first of a row's),
    a baseline without tokens/s, which leaves every speed-up out, and why a row has no
    time to loss (not reached, or no loss measured: said once)."""
    out = []
    for row in rows:
        if row.error is None:
            continue
        if row.failed == row.runs:
            out.append(f"{row.combo} failed: {row.error}")
        else:
            out.append(f"{row.combo}: {row.failed} of {row.runs} runs failed: {row.error}")
    if len(rows) > 1 and rows[0].tokens_per_s is None:
        out.append(f"no speed-ups: the baseline {rows[0].combo} has no tokens/s")
    if any(row.requests for row in rows):
        out.append("inference requests: served of arrived (first token out), rejected (not "
                   "started within the deadline), expired (served, first token after it)")
    losses = [(row.combo, row.to_loss) for row in rows if row.to_loss]
    out += loss_notes(losses, any(not t.default for _, t in losses) and len(rows) > 1)
    said: set[str] = set()
    for row in rows:  # why a row has no time to loss, each reason once
        if row.to_loss and row.to_loss.why and row.to_loss.reached == 0:
            why = row.to_loss.why
            line = (f"time to loss n/a: {why}" if row.to_loss.not_reached == 0
                    else f"{row.combo}: loss <= {row.to_loss.target:g} {why}")
            if line not in said:
                said.add(line)
                out.append(line)
    return out


def _header(rows: Sequence[Row]) -> list[str]:
    header = ["policy", "iteration (s)", "spread (s)", "speed-up", "tokens/s"]
    losses = [row.to_loss for row in rows if row.to_loss]
    if any(t.effective_tokens_per_s is not None for t in losses):
        header.append(EFFECTIVE)
    if losses:
        bases = {t.basis for t in losses}
        header.append(f"time to loss {losses[0].target:.4g}"
                      + (f" ({bases.pop()})" if len(bases) == 1 else ""))
    header += ["GPU train", "GPU total", "WAN", "TTFT p50", "TTFT p99"]
    if any(row.requests for row in rows):
        header += ["served", "rejected", "expired"]
    header.append("slowdown")
    if any(row.predicted is not None for row in rows):
        header += ["simulated (s)", "dilation", "machine-bound"]
    return header


def _cells(row: Row, header: Sequence[str], unit: str) -> list[str]:
    """The row's cells under `header`; `unit` goes between a number and its unit."""
    if row.iteration_s is None:
        return [row.combo, "failed"] + ["-"] * (len(header) - 2)
    targeted = any(h.startswith("time to loss") for h in header)
    effective = row.to_loss.effective_tokens_per_s if row.to_loss else None
    return [
        row.combo + (f" ({row.failed} failed)" if row.failed else ""),
        _fmt(row.iteration_s, "{:.3f}"),
        row.spread_text(),
        _fmt(row.speedup, "{:.2f}x"),
        _fmt(row.tokens_per_s, "{:.0f}"),
        *([_fmt(effective, "{:.0f}")] if EFFECTIVE in header else []),
        *([row.to_loss.cell(unit) if row.to_loss else "-"] if targeted else []),
        _fmt(row.util_training, "{:.1%}"),
        _fmt(row.util_total, "{:.1%}"),
        _fmt(row.wan_util, "{:.1%}"),
        _fmt(row.ttft_p50, "{:.3f}" + unit + "s"),
        _fmt(row.ttft_p99, "{:.3f}" + unit + "s"),
        *((row.requests.cells() if row.requests else ["-"] * 3) if "served" in header else []),
        slowdown_text(row),
        *(row.emulation_cells() if "dilation" in header else []),
    ]


def table_text(rows: Sequence[Row]) -> str:
    """A plain-text table a terminal, a log and a paper draft can all take (what came
    from files, a policy's name or a reason, as one printable line: testbed.errors)."""
    header = _header(rows)
    return "\n".join(aligned(header, [_cells(row, header, "") for row in rows])
                     + [one_line(note) for note in notes(rows)])


def markdown_table(rows: Sequence[Row]) -> str:
    header = _header(rows)
    names = {"spread (s)": "spread", "GPU train": "GPU util (train)",
             "GPU total": "GPU util (total)", "WAN": "WAN util"}
    lines = ["| " + " | ".join(names.get(h, h) for h in header) + " |",
             "|" + "---|" * len(header)]
    for row in rows:
        cells = _cells(row, header, " ")
        if row.iteration_s is None:
            cells = [row.combo, "failed"] + [""] * (len(header) - 2)
        lines.append("| " + " | ".join(one_line(cell) for cell in cells) + " |")
    explained = [one_line(note) for note in notes(rows)]
    return "\n".join(lines + (["", *explained] if explained else []))
