"""Spans as the simulator keeps them: one row (a tuple) per span of a group of GPUs that
did the same thing at once (a tensor-parallel group's forward is one row, not one dict per
GPU), read back as the per-GPU spans of testbed.common.spans wherever a report wants those.

A run at 16,384 GPUs makes millions of spans; a dict per GPU and span was most of its
memory and most of the time its summary and files took. Readers that go through every
span (the summary, the trace, spans.json) take `rows(spans)` instead, which reads either
form: a table's rows, or a list of per-GPU spans (the emulator's) as rows of one GPU.
(Rows, not columns: one tuple per span costs a run less to make than an append to each
of six lists, and every reader takes a whole row at a time.)
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import cast, overload

from testbed.common.spans import Span, SpanDetail, SpanKind

Row = tuple[tuple[str, ...], SpanKind, float, float, int, SpanDetail]
"""(GPUs, kind, start, end, iteration, the rest of the span's fields)."""

_COMMON = ("gpu", "kind", "start", "end", "iteration")


class SpanTable(Sequence[Span]):
    """Rows; as a sequence, every row's span on each of its GPUs, in the order they were
    added (a group's GPUs in its order), exactly the dicts a list would hold."""

    def __init__(self) -> None:
        self._rows: list[Row] = []
        self._count = 0
        self._spans: list[Span] | None = None

    def add(self, gpus: tuple[str, ...], kind: SpanKind, start: float, end: float,
            iteration: int, detail: SpanDetail) -> None:
        """One span on every GPU of `gpus`; `detail`: its other fields (stage,
        microbatch, bytes, ...)."""
        self._rows.append((gpus, kind, start, end, iteration, detail))
        self._count += len(gpus)

    def extend(self, spans: Iterable[Span]) -> None:
        """Per-GPU spans, each a row of its one GPU."""
        for row in rows(spans):
            self.add(*row)

    def rows(self) -> Iterator[Row]:
        return iter(self._rows)

    def last_end(self) -> float:
        """When the last span ended (0 for none)."""
        return max((row[3] for row in self._rows), default=0.0)

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Span]:
        for gpus, kind, start, end, iteration, detail in self.rows():
            for gpu in gpus:
                yield {"gpu": gpu, "kind": kind, "start": start, "end": end,
                       "iteration": iteration, **detail}

    @overload
    def __getitem__(self, index: int) -> Span: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Span]: ...

    def __getitem__(self, index: int | slice) -> Span | Sequence[Span]:
        """By position among the per-GPU spans (made once, on the first such read)."""
        if self._spans is None or len(self._spans) != self._count:
            self._spans = list(self)
        return self._spans[index]


def rows(spans: Iterable[Span]) -> Iterator[Row]:
    """Every span as a row: a table's own rows, or each per-GPU span as a row of its GPU."""
    if isinstance(spans, SpanTable):
        return spans.rows()
    return (((s["gpu"],), s["kind"], s["start"], s["end"], s["iteration"], _detail(s))
            for s in spans)


def _detail(span: Span) -> SpanDetail:
    detail: Mapping[str, object] = {k: v for k, v in span.items() if k not in _COMMON}
    return cast(SpanDetail, detail)  # a Span less its common keys


def last_end(spans: Sequence[Span]) -> float:
    """When the last span ended (0 for none)."""
    if isinstance(spans, SpanTable):
        return spans.last_end()
    return max((s["end"] for s in spans), default=0.0)
