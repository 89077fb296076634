"""A worker's view of its part of the plan, read from the coordinator's `config`
message: shared by the worker process and its stage runner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.plan.model import Action
from testbed.runtime.messages import PeerInfo


@dataclass
class WorkerConfig:
    """What the coordinator tells a worker; mirrors the `config` control message."""

    index: int
    gpu: str
    dc: str
    replica: int
    stage: int
    pp: int
    """Stages in the pipeline (the message's `layers` has one count per stage)."""
    actions: list[Action]
    prev: PeerInfo | None
    next: PeerInfo | None
    ring: list[PeerInfo]
    """This stage's replicas in ring order (this worker included)."""
    arbitrated: set[str]
    """WAN link directions (`src>dst`) whose transfers need a grant."""
    iterations: int
    raw: dict[str, Any]
    first_iteration: int = 0
    """Where a resumed run starts; its state comes from `restore_dir`."""
    restore_dir: str | None = None
    checkpoint_dir: str | None = None
    checkpoint_every: int = 0

    @classmethod
    def from_message(cls, msg: dict[str, Any]) -> WorkerConfig:
        def peer(data: dict[str, Any] | None) -> PeerInfo | None:
            return None if data is None else PeerInfo(data["index"], data["gpu"], data["dc"])

        return cls(
            index=msg["index"],
            gpu=msg["gpu"],
            dc=msg["dc"],
            replica=msg["replica"],
            stage=msg["stage"],
            pp=len(msg["layers"]),
            actions=[Action.parse(a) for a in msg["actions"]],
            prev=peer(msg.get("prev")),
            next=peer(msg.get("next")),
            ring=[PeerInfo(p["index"], p["gpu"], p["dc"]) for p in msg["ring"]],
            arbitrated=set(msg.get("arbitrated", [])),
            iterations=msg["iterations"],
            raw=msg,
            first_iteration=int(msg.get("first_iteration", 0)),
            restore_dir=msg.get("restore_dir"),
            checkpoint_dir=msg.get("checkpoint_dir"),
            checkpoint_every=int(msg.get("checkpoint_every", 0)),
        )
