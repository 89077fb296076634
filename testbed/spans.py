"""Spans: the timed records of what each GPU did, which the simulator and the emulator's
workers both write, so that metrics, reports and traces cannot tell the backends apart.

Times are seconds on one clock. Spans read back from spans.json, a checkpoint or a
worker's message are plain JSON objects with these keys.
"""

from __future__ import annotations

from typing import Literal, TypedDict

SpanKind = Literal[
    "forward",
    "backward",
    "step",
    "allreduce",
    "send",
    "recv",
    "transfer",
    "wait_grant",
    "wait_send",
    "prefill",
    "kv_transfer",
    "net_event",
]
"""Compute (forward, backward, step, prefill), the gradient all-reduce, the pipeline's
messages (send, recv, transfer: the bytes on their way, wait_grant: an arbitrated link not
yet granted, wait_send: a stage waiting for its own send to complete), a KV cache on its
way to decode, and a network event (`gpu` is "network")."""


class SpanDetail(TypedDict, total=False):
    """The fields a span carries where they apply."""

    stage: int
    """Every span but a network event's."""
    microbatch: int | None
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
    """Position of a receive or all-reduce in its action list, which bubble predictions
    key on."""
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

