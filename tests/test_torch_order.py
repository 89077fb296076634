"""The baselines' action lists against what torch's own ScheduleGPipe and Schedule1F1B
execute: `_step_microbatches` runs with a stub stage and recording p2p helpers, so the
trace is torch's runtime order of compute, posted messages and waits, not its order
table (which differs for 1F1B's last rank)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest
import torch.distributed.pipelining.schedules as schedules

from testbed.plan.model import Action, Op
from testbed.plan.schedules import Sends, schedule_compute, stage_actions

Message = tuple[str, int]
Event = str | tuple[str, frozenset[Message]]
"""A compute ("F3") or a group of posts or waits ("post"/"wait", messages)."""


def _merge(raw: Iterable[tuple[str, Message] | str]) -> list[Event]:
    """Consecutive posts (or waits) become one group: their order inside it is free."""
    out: list[Event] = []
    for item in raw:
        if isinstance(item, str):
            out.append(item)
            continue
        kind, message = item
        last = out[-1] if out else None
        if isinstance(last, tuple) and last[0] == kind:
            out[-1] = (kind, last[1] | {message})
        else:
            out.append((kind, frozenset({message})))
    return out


def _torch_trace(monkeypatch: pytest.MonkeyPatch, schedule: str, stage: int, stages: int,
                 microbatches: int) -> list[Event]:
    raw: list[tuple[str, Message] | str] = []
    last = stages - 1

    class StubStage:
        stage_index = stage

        def get_fwd_recv_ops(self, mb: int) -> list[Message]:
            return [("RECV_F", mb)] if stage > 0 else []

        def get_fwd_send_ops(self, mb: int) -> list[Message]:
            return [("SEND_F", mb)] if stage < last else []

        def get_bwd_recv_ops(self, mb: int) -> list[Message]:
            return [("RECV_B", mb)] if stage < last else []

        def get_bwd_send_ops(self, mb: int) -> list[Message]:
            return [("SEND_B", mb)] if stage > 0 else []

        def forward_one_chunk(self, mb: int, *_args: Any, **_kwargs: Any) -> None:
            raw.append(f"F{mb}")

        def backward_one_chunk(self, mb: int, **_kwargs: Any) -> None:
            raw.append(f"B{mb}")

        def perform_reduce_grad(self, *_args: Any) -> None:
            pass

    def batch_p2p(ops: list[Message], desc: str | None = None) -> list[Message]:
        raw.extend(("post", op) for op in ops)
        return list(ops)

    def sorted_batch_p2p(ops: list[Message], desc: str | None = None) -> dict[int, Any]:
        return {0: batch_p2p(ops)} if ops else {}

    def wait_batch_p2p(work: list[Message]) -> None:
        raw.extend(("wait", op) for op in work)

    monkeypatch.setattr(schedules, "_batch_p2p", batch_p2p)
    monkeypatch.setattr(schedules, "_sorted_batch_p2p", sorted_batch_p2p)
    monkeypatch.setattr(schedules, "_wait_batch_p2p", wait_batch_p2p)
    cls = schedules.ScheduleGPipe if schedule == "gpipe" else schedules.Schedule1F1B
    runner = object.__new__(cls)
    runner._stage = StubStage()
    runner._num_stages = stages
    runner._n_microbatches = microbatches
    runner.scale_grads = True
    runner._check_inputs = lambda *_a: ([()] * microbatches, [{}] * microbatches)
    for name in ("_initialize_stage", "_maybe_compute_loss", "_maybe_get_loss",
                 "_update_losses"):
        setattr(runner, name, lambda *_a, **_k: None)
    runner._step_microbatches()
    return _merge(raw)


def _ours(actions: Iterable[Action]) -> list[Event]:
    """What our backends do for each action: a receive is posted and waited at once."""
    raw: list[tuple[str, Message] | str] = []
    for action in actions:
        op, mb = action.op, action.microbatch
        if op.is_compute:
            raw.append(f"{op.value}{mb}")
        elif op.is_send:
            raw.append(("post", (op.value, mb)))  # type: ignore[arg-type]
        elif op.is_recv:
            raw += [("post", (op.value, mb)), ("wait", (op.value, mb))]  # type: ignore[list-item]
        elif op.is_wait:
            sent = Op.SEND_F if op is Op.WAIT_F else Op.SEND_B
            raw.append(("wait", (sent.value, mb)))  # type: ignore[arg-type]
    return _merge(raw)


CASES = [(stages, microbatches) for stages in (1, 2, 3, 4, 6)
         for microbatches in (stages, stages + 1, 2 * stages + 3)]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("stages", "microbatches"), CASES)
def test_torch_sends_match_torchs_runtime(monkeypatch: pytest.MonkeyPatch, schedule: str,
                                          stages: int, microbatches: int) -> None:
    for stage in range(stages):
        ours = stage_actions(schedule, stage, stages, microbatches, 1, Sends.TORCH)
        expected = _torch_trace(monkeypatch, schedule, stage, stages, microbatches)
        assert _ours(ours) == expected, f"stage {stage} of {stages}, {microbatches} microbatches"


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "1f1b+2", "1f1b+3/2/1/0"])
@pytest.mark.parametrize("microbatches", [1, 3, 4, 9])
def test_both_send_modes_compute_in_the_same_order(schedule: str, microbatches: int) -> None:
    for stage in range(4):
        compute = schedule_compute(schedule, stage, 4, microbatches)
        for sends in Sends:
            actions = stage_actions(schedule, stage, 4, microbatches, 2, sends)
            assert [a for a in actions if a.op.is_compute] == compute
            waits = [a for a in actions if a.op.is_wait]
            sent = [a for a in actions if a.op.is_send]
            assert len(waits) == (len(sent) if sends is Sends.TORCH else 0)


def test_torch_loaded_in_a_thread_while_another_asks_for_an_order() -> None:
    """A planner preloads torch in a thread while its main thread may build an order:
    both go through one lock (Python's import locks see a deadlock where two threads
    import a package and one of its modules at once, and fail one of them)."""
    import subprocess
    import sys

    code = ("import threading\n"
            "from testbed.plan.torch_order import load_torch, stage_ranks\n"
            "errors = []\n"
            "def preload():\n"
            "    try:\n"
            "        load_torch()\n"
            "    except BaseException as exc:\n"
            "        errors.append(repr(exc))\n"
            "thread = threading.Thread(target=preload)\n"
            "thread.start()\n"
            "print(sorted(stage_ranks('interleaved-1f1b', 2, 2).items()))\n"
            "thread.join()\n"
            "print(errors)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.splitlines() == ["[(0, 0), (1, 1), (2, 0), (3, 1)]", "[]"]
