"""The messages of WAN arbitration (testbed.policy.arbiter): a worker asks for a link
direction for one transfer, the coordinator grants it, the worker says when its last byte
has left."""

from __future__ import annotations

from dataclasses import dataclass

from testbed.emulator.runtime.wire.messages import Message


@dataclass(frozen=True)
class TransferRequest(Message):
    """A transfer waits for an arbitrated WAN link direction."""

    op = "request"
    wire_names = {"nbytes": "bytes"}
    tag: str
    link: str
    """`src_dc>dst_dc`"""
    src: str
    dst: str
    kind: str
    replica: int
    stage: int
    microbatch: int
    nbytes: int
    iteration: int
    ready_at: float
    collective: str = ""
    """A ring's chunk (kind ALLREDUCE): its collective's text."""


@dataclass(frozen=True)
class Sent(Message):
    """The last byte of a granted transfer has left: its link direction is free."""

    op = "sent"
    tag: str


@dataclass(frozen=True)
class Grant(Message):
    op = "grant"
    tag: str
