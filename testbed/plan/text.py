"""Plans as CSV (to save, diff and load) and as a grid (to read)."""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TypedDict

from testbed.common.codec import JsonObject
from testbed.common.input_files import MAX_CSV_BYTES, read_input
from testbed.common.jsonio import loads
from testbed.common.units import plural
from testbed.errors import InputError
from testbed.plan.model import (
    Action,
    HostTcp,
    OuterOptimizer,
    Plan,
    Sharing,
    SyncOrder,
    Worker,
)

IntMeta = Literal["dp", "pp", "tp", "microbatches", "microbatch_size"]
_INT_META: tuple[IntMeta, ...] = ("dp", "pp", "tp", "microbatches", "microbatch_size")


class PlanMeta(TypedDict, total=False):
    """A plan CSV's meta rows, each checked as it is read; `plan` refuses a file
    without those a plan needs."""

    policy: str
    dp: int
    pp: int
    tp: int
    microbatches: int
    microbatch_size: int
    layers: tuple[int, ...]
    cycle: tuple[int, ...]
    opening: tuple[int, ...]
    sync_order: SyncOrder


def plan_to_csv(plan: Plan) -> str:
    """One row per fact; the first cell says what the row is. A stage's GPUs share one
    action list (build_plan): each list is written out once and its text reused."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    texts: dict[int, str] = {}

    def actions_row(head: list[Any], actions: tuple[Action, ...]) -> None:
        text = texts.get(id(actions))
        if text is None:
            text = texts[id(actions)] = "," + _csv_line(map(str, actions)) if actions else ""
        out.write(_csv_line(head) + text + "\n")

    writer.writerow(["meta", "policy", plan.policy])
    for key in _INT_META:
        writer.writerow(["meta", key, getattr(plan, key)])
    writer.writerow(["meta", "layers", " ".join(map(str, plan.layers))])
    writer.writerows(["place", replica, stage, *gpus] for (replica, stage), gpus in plan.workers())
    for gpu in plan.used_gpus():
        actions_row(["actions", gpu], plan.actions[gpu])
    if plan.cycle:
        writer.writerow(["meta", "cycle", format_cycle(plan.cycle)])
    if plan.opening:
        writer.writerow(["meta", "opening", format_cycle(plan.opening)])
    if plan.sync_order is not SyncOrder.FAIR:
        writer.writerow(["meta", "sync_order", plan.sync_order.value])
    for index, program in enumerate(plan.programs, start=1):
        for gpu in plan.used_gpus():
            actions_row(["program", index, gpu], program[gpu])
    _write_network_and_extras(out, plan)
    return out.getvalue()


def _write_network_and_extras(out: io.StringIO, plan: Plan) -> None:
    """The rows after the schedule's: connections, sharing, DP cells, host TCP, the outer
    optimizer, notes."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerows(["conn", a, b, n] for (a, b), n in sorted(plan.connections.items()))
    for (src, dst), sharing in sorted(plan.sharing.items()):
        writer.writerow(["share", src, dst, sharing.value])
    for cell in plan.dp_cells:
        writer.writerow(["cell", *cell])
    if plan.host_tcp.slow_start_after_idle is not None:
        writer.writerow(["tcp", "slow_start_after_idle",
                         "on" if plan.host_tcp.slow_start_after_idle else "off"])
    if plan.host_tcp.buffer_bytes is not None:
        writer.writerow(["tcp", "buffer_bytes", plan.host_tcp.buffer_bytes])
    if plan.outer != OuterOptimizer():
        for key, value in plan.outer.to_dict().items():
            writer.writerow(["outer", key, _format_outer(value)])
    for key, value in plan.notes.items():
        writer.writerow(["note", key, json.dumps(value, sort_keys=True)])


def _csv_line(cells: Iterable[Any]) -> str:
    """One CSV row's text, without its line end."""
    line = io.StringIO()
    csv.writer(line, lineterminator="").writerow(cells)
    return line.getvalue()


def load_plan_csv(path: str | Path) -> Plan:
    return parse_plan_csv(read_input(path, MAX_CSV_BYTES), str(path))


def parse_plan_csv(text: str, source: str | None = None) -> Plan:
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise InputError(f"not CSV: {exc}", source) from None
    read = _PlanRows(source)
    for number, cells in enumerate(rows, start=1):
        if not cells or not "".join(cells).strip():
            continue
        row = _Row(cells, source, f"line {number}")
        kind = cells[0].strip()
        reader = _ROW_READERS.get(kind)
        if reader is None:
            raise row.error(
                f"unknown row kind {kind!r} (meta, place, actions, program, conn, share, cell, "
                "tcp, outer, note)"
            )
        reader(read, row)
    return read.plan()


class _Row:
    """One row of a plan's CSV and where it is: each cell parsed, or a one-line error
    naming the file, the line and the cell."""

    def __init__(self, cells: list[str], source: str | None, where: str) -> None:
        self.cells, self.source, self.where = cells, source, where

    def error(self, message: str) -> InputError:
        return InputError(message, self.source, self.where)

    def cell(self, index: int, parse: Callable[[str], Any], what: str) -> Any:
        if index >= len(self.cells):
            raise self.error(f"missing {what}")
        try:
            return parse(self.cells[index].strip())
        except ValueError as exc:
            raise self.error(f"bad {what}: {exc}") from None

    def actions(self, first: int) -> tuple[Action, ...]:
        """The row's actions from cell `first` on, empty cells skipped."""
        return tuple(self.cell(i, Action.parse, "action")
                     for i in range(first, len(self.cells)) if self.cells[i].strip())


@dataclass
class _PlanRows:
    """What a plan's CSV has said so far, one method per row kind (the first cell)."""

    source: str | None
    meta: PlanMeta = field(default_factory=PlanMeta)
    placement: dict[Worker, tuple[str, ...]] = field(default_factory=dict)
    actions: dict[str, tuple[Action, ...]] = field(default_factory=dict)
    programs: dict[int, dict[str, tuple[Action, ...]]] = field(default_factory=dict)
    connections: dict[tuple[str, str], int] = field(default_factory=dict)
    sharing: dict[tuple[str, str], Sharing] = field(default_factory=dict)
    cells: list[tuple[int, ...]] = field(default_factory=list)
    host_tcp: HostTcp = field(default_factory=HostTcp)
    outer: OuterOptimizer = field(default_factory=OuterOptimizer)
    notes: JsonObject = field(default_factory=dict)  # Plan.notes: the policy's, free-form

    def meta_row(self, row: _Row) -> None:
        key = row.cell(1, str, "key")
        number = next((name for name in _INT_META if name == key), None)
        if key == "policy":
            self.meta["policy"] = row.cell(2, str, "policy name")
        elif number is not None:
            self.meta[number] = row.cell(2, _natural, key)
        elif key == "layers":
            self.meta["layers"] = row.cell(2, lambda v: tuple(_natural(x) for x in v.split()),
                                           "layers")
        elif key == "cycle":
            self.meta["cycle"] = row.cell(2, parse_cycle, key)
        elif key == "opening":
            self.meta["opening"] = row.cell(2, parse_cycle, key)
        elif key == "sync_order":
            self.meta["sync_order"] = row.cell(2, SyncOrder,
                                               "sync_order (fair, first-layers or policy)")
        else:
            raise row.error(f"unknown meta key {key!r}")

    def place_row(self, row: _Row) -> None:
        worker = (row.cell(1, _whole, "replica"), row.cell(2, _whole, "stage"))
        if worker in self.placement:
            raise row.error(f"replica {worker[0]} stage {worker[1]} placed twice")
        gpus = tuple(g.strip() for g in row.cells[3:] if g.strip())
        if not gpus:
            raise row.error("missing GPU")
        self.placement[worker] = gpus

    def actions_row(self, row: _Row) -> None:
        gpu = row.cell(1, _nonempty, "GPU")
        if gpu in self.actions:
            raise row.error(f"actions for {gpu} given twice")
        self.actions[gpu] = row.actions(2)

    def program_row(self, row: _Row) -> None:
        index = row.cell(1, _natural, "program number")
        gpu = row.cell(2, _nonempty, "GPU")
        program = self.programs.setdefault(index, {})
        if gpu in program:
            raise row.error(f"program {index} of {gpu} given twice")
        program[gpu] = row.actions(3)

    def conn_row(self, row: _Row) -> None:
        a, b = row.cell(1, _nonempty, "GPU"), row.cell(2, _nonempty, "GPU")
        self.connections[(a, b) if a <= b else (b, a)] = row.cell(3, _natural,
                                                                  "connection count")

    def share_row(self, row: _Row) -> None:
        # the value is read first, as an assignment evaluates its right side first
        self.sharing[(row.cell(1, _nonempty, "DC"), row.cell(2, _nonempty, "DC"))] = row.cell(
            3, Sharing, "sharing (fair or arbitrated)"
        )

    def cell_row(self, row: _Row) -> None:
        self.cells.append(tuple(row.cell(i, _whole, "replica")
                                for i in range(1, len(row.cells))))

    def tcp_row(self, row: _Row) -> None:
        key = row.cell(1, str, "key")
        if key == "slow_start_after_idle":
            self.host_tcp = replace(self.host_tcp, slow_start_after_idle=row.cell(2, _on_off, key))
        elif key == "buffer_bytes":
            self.host_tcp = replace(self.host_tcp, buffer_bytes=row.cell(2, _natural, key))
        else:
            raise row.error(f"unknown tcp key {key!r} (slow_start_after_idle, buffer_bytes)")

    def outer_row(self, row: _Row) -> None:
        key = row.cell(1, str, "key")
        if key not in OuterOptimizer.__dataclass_fields__:
            raise row.error(f"unknown outer key {key!r} "
                            f"({', '.join(OuterOptimizer.__dataclass_fields__)})")
        parse_value = _on_off if key in ("nesterov", "eager") else _finite
        self.outer = replace(self.outer, **{key: row.cell(2, parse_value, key)})

    def note_row(self, row: _Row) -> None:
        self.notes[row.cell(1, str, "key")] = row.cell(2, loads, "JSON value")

    def plan(self) -> Plan:
        """The plan the rows make, once every row is read: what the file as a whole must
        hold checked first."""
        meta, programs, source = self.meta, self.programs, self.source
        for key in ("policy", *_INT_META, "layers"):
            if key not in meta:
                raise InputError(f"missing meta row for {key!r}", source)
        if sorted(programs) != list(range(1, len(programs) + 1)):
            raise InputError(f"programs are numbered {sorted(programs)}: expected 1 to "
                             f"{len(programs)}", source)
        cycle: tuple[int, ...] = meta.get("cycle", ())
        opening: tuple[int, ...] = meta.get("opening", ())
        for name, listed in (("cycle", cycle), ("opening", opening)):
            if any(index > len(programs) for index in listed):
                raise InputError(f"the {name} names program {max(listed)}, the file has "
                                 f"{len(programs)} besides the actions rows", source)
        return Plan(
            policy=meta["policy"],
            dp=meta["dp"],
            pp=meta["pp"],
            microbatches=meta["microbatches"],
            microbatch_size=meta["microbatch_size"],
            layers=meta["layers"],
            placement=self.placement,
            actions=self.actions,
            connections=self.connections,
            sharing=self.sharing,
            tp=meta["tp"],
            dp_cells=tuple(self.cells),
            host_tcp=self.host_tcp,
            notes=self.notes,
            programs=tuple(programs[index] for index in sorted(programs)),
            cycle=cycle,
            opening=opening,
            outer=self.outer,
            sync_order=meta.get("sync_order", SyncOrder.FAIR),
        )


_ROW_READERS: dict[str, Callable[[_PlanRows, _Row], None]] = {
    "meta": _PlanRows.meta_row,
    "place": _PlanRows.place_row,
    "actions": _PlanRows.actions_row,
    "program": _PlanRows.program_row,
    "conn": _PlanRows.conn_row,
    "share": _PlanRows.share_row,
    "cell": _PlanRows.cell_row,
    "tcp": _PlanRows.tcp_row,
    "outer": _PlanRows.outer_row,
    "note": _PlanRows.note_row,
}
"""A row's reader by its first cell."""


def format_cycle(cycle: tuple[int, ...]) -> str:
    """`0x9 1`: program 0 nine times, then program 1."""
    runs = [(program, len(list(group))) for program, group in itertools.groupby(cycle)]
    return " ".join(str(p) if n == 1 else f"{p}x{n}" for p, n in runs)


def parse_cycle(text: str) -> tuple[int, ...]:
    out: list[int] = []
    for token in text.split():
        program, _, count = token.partition("x")
        repeat = _natural(count) if count else 1
        out.extend([_whole(program)] * repeat)
        if len(out) > MAX_PERIOD:
            raise ValueError(f"longer than {MAX_PERIOD} iterations")
    if not out:
        raise ValueError("empty")
    return tuple(out)


MAX_PERIOD = 100_000
"""Iterations in one cycle, at most (DiLoCo's H runs to hundreds or a few thousand)."""


def _format_outer(value: object) -> str:
    return ("on" if value else "off") if isinstance(value, bool) else repr(value)


def _finite(value: str) -> float:
    number = float(value)
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"must be a finite number, zero or more, got {value!r}")
    return number


def _on_off(value: str) -> bool:
    if value not in ("on", "off"):
        raise ValueError("on or off")
    return value == "on"


def _natural(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(f"must be at least 1, got {number}")
    return number


def _whole(value: str) -> int:
    number = int(value)
    if number < 0:
        raise ValueError(f"must not be negative, got {number}")
    return number


def _nonempty(value: str) -> str:
    if not value:
        raise ValueError("empty")
    return value


def plan_grid(
    plan: Plan, communication: bool = False, max_rows: int | None = None, max_columns: int = 16
) -> str:
    """One column per GPU (per tensor-parallel group), one row per step, like torch's
    pipeline order: `r0s1` runs replica 0's stage 1, `r0s0,7` stages 0 and 7 (virtual
    stages; each action names its stage). `(0F7;7B3)` is an OVERLAP_F_B of 0F7 and 7B3.

    Wide plans show replica 0 only (every replica runs the same schedule).
    """
    groups = list(dict.fromkeys((replica, gpus) for (replica, _), gpus in plan.workers()))
    note = ""
    if len(groups) > max_columns:
        shown_groups = [g for g in groups if g[0] == 0][:max_columns]
        note = (f"(showing {len(shown_groups)} of {plural(len(groups), 'GPU column')}: "
                "replica 0)")
        groups = shown_groups
    columns = []
    overlaps = False
    for replica, gpus in groups:
        steps = []
        for a in plan.actions[gpus[0]]:
            if not communication and (a.op.is_send or a.op.is_recv or a.op.is_wait):
                continue
            overlaps |= bool(a.parts)
            steps.append(f"({';'.join(map(str, a.parts))})" if a.parts else str(a))
        label = gpus[0] if len(gpus) == 1 else f"{gpus[0]}+{len(gpus) - 1}"
        stages = ",".join(map(str, plan.stages_of(gpus[0])))
        columns.append((f"r{replica}s{stages}", label, steps))
    height = max(len(c[2]) for c in columns)
    shown = height if max_rows is None else min(height, max_rows)
    widths = [max(len(c[0]), len(c[1]), *(len(s) for s in c[2])) for c in columns]

    def line(prefix: str, cells: list[str]) -> str:
        return (prefix + " ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True))).rstrip()

    lines = [line("step  ", [c[0] for c in columns]), line("      ", [c[1] for c in columns])]
    for row in range(shown):
        lines.append(line(f"{row:<5} ", [c[2][row] if row < len(c[2]) else "" for c in columns]))
    if shown < height:
        lines.append(f"... {height - shown} more steps")
    if overlaps:
        lines.append("(a;b): a and b run as one unit (OVERLAP_F_B)")
    if note:
        lines.append(note)
    return "\n".join(lines)
