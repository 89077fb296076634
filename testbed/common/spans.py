"""Spans: the timed records of what each GPU did, which the simulator and the emulator's
workers both write, so that metrics, reports and traces cannot tell the backends apart.

Times are seconds on one clock. Spans read back from spans.json, a checkpoint or a
worker's message are plain JSON objects with these keys.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, NotRequired, TypedDict

from testbed.common.codec import JsonObject
from testbed.common.fields import Fields, boolean, integer, number, string

SpanKind = Literal[
    "forward",
    "backward",
    "step",
    "outer_step",
    "allreduce",
    "wait_reduce",
    "send",
    "recv",
    "transfer",
    "wait_grant",
    "wait_send",
    "prefill",
    "kv_transfer",
    "net_event",
    "failure",
]
"""Compute (forward, backward, step, outer_step: DiLoCo's outer optimizer step, prefill),
an all-reduce (from the member's join to the result, whether it waited or went on),
wait_reduce: a stage waiting for an all-reduce it started earlier, the pipeline's
messages (send, recv, transfer: the bytes on their way, wait_grant: an arbitrated link not
yet granted, wait_send: a stage waiting for its own send to complete), a KV cache on its
way to decode, a network event (`gpu` is "network"), and a scenario's failure (on the
lost GPU, from its loss to training going on: testbed.run.recovery)."""


class SpanDetail(TypedDict, total=False):
    """The fields a span carries where they apply."""

    stage: int
    """Every span but a network event's."""
    microbatch: int | None
    part: Literal["I", "W"]
    """A backward's part when it is split (testbed.plan.interpret.Part): I computes the
    input gradient, W the weight gradient; a whole backward has none."""
    bytes: int
    link: str | None
    """`src_dc>dst_dc` for traffic that crosses the WAN, None inside a DC."""
    peer: str
    """The GPU at the other end of a send, receive or transfer."""
    src: str
    dst: str
    tag: str
    """The message's name on the wire; for a pipeline message, its MessageTag
    (testbed.plan.interpret)."""
    action: int
    """Position of a receive, all-reduce or wait for one in its iteration's action list,
    which bubble predictions key on; an all-reduce that ran while the stage went on
    (ALLREDUCE_START) has none: the GPU did not wait there."""
    collective: str
    """An all-reduce's subject in the plan's text form (testbed.plan.collective: `delta,
    f1/4,int4`); '' for the whole gradient across all replicas."""
    waited: float
    """How long a receive waited for its data to complete (the emulator's)."""
    modeled: bool
    """The bytes' time was modeled rather than moved (emulated compute inside a DC)."""
    request: int
    """The inference request whose KV cache a kv_transfer carries."""
    requests: list[int]
    """The requests a prefill pass worked on (whole, or a chunk of each)."""
    tokens: int
    """Prompt tokens a prefill pass processed."""
    detail: str
    """What a network event did, in words."""


class Span(SpanDetail):
    """Both backends build spans as typed literals, so a misspelt key or a wrong type
    fails type checking instead of a report."""

    gpu: str
    kind: SpanKind
    start: float
    end: float
    iteration: int
    """-1 for a network event."""


class SpanRow(SpanDetail):
    """A row of spans.json: a span of one GPU (`gpu`), or once for a group of GPUs that
    did the same at once (`gpus`: the simulator's tensor-parallel groups)."""

    gpu: NotRequired[str]
    gpus: NotRequired[list[str]]
    kind: SpanKind
    start: float
    end: float
    iteration: int


def is_wait(span: Mapping[str, Any]) -> bool:
    """A GPU idle at one of its actions until something arrives: a receive, or an
    all-reduce or the wait for one that carries its action (one started to run while the
    stage went on carries none)."""
    kind = span["kind"]
    return kind == "recv" or (kind in ("allreduce", "wait_reduce")
                              and span.get("action") is not None)


def read_span(fields: Fields) -> Span:
    """A span read back from a file, checked against Span's own types (one located
    InputError for a missing, mistyped or unknown key, or an end before its start)."""
    hints = typing.get_type_hints(Span)
    span: JsonObject = {}  # checked field by field, then a Span
    for name, hint in hints.items():
        if name in Span.__required_keys__ or fields.raw(name, None) is not None:
            span[name] = fields.get(name, _parser(hint))
        elif fields.has(name):  # given as null: only where the type says so
            if type(None) not in typing.get_args(hint):
                raise fields.error(name, "expected a value, got null")
            span[name] = None
    fields.done()
    if span["end"] < span["start"]:
        raise fields.error("end", f"{span['end']} is before the span's start, {span['start']}")
    return typing.cast(Span, span)


def _parser(hint: Any) -> Callable[[Any], Any]:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    origin = typing.get_origin(hint)
    if origin is Literal:
        return lambda value: _one_of(value, args)
    if origin is list:
        item = _parser(args[0])
        return lambda value: [item(v) for v in _list(value)]
    if args:  # X | None
        return _parser(args[0])
    return {int: integer, float: number, bool: boolean, str: string}[hint]


def _one_of(value: Any, choices: list[Any]) -> Any:
    if value not in choices:
        raise ValueError(f"expected one of {', '.join(map(str, choices))}, got {value!r}")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {value!r}")
    return value
