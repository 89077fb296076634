"""A GPU's compute order lowered into its actions with the communication torch's runtime
for lowered schedules (`_PipelineScheduleRuntime`, fed by `_add_send_recv` and
`_add_reduce_grad`) issues. Pure.

Torch posts a stage's send right after the compute whose output it sends, and the
receive its next compute needs is waited for right before that compute (torch posts it
earlier; a posted receive does nothing a plan can see until it is waited for, so the plan
receives where torch waits). Between two stages on the same GPU torch sends nothing: the
output is handed over in memory; the plan keeps the pair of actions, which the
interpreter marks `local`. A stage's gradients are reduced right after its last backward
(torch's REDUCE_GRAD), the sends are waited for only at the end of the step, the last
posted first, and the optimizer then steps every stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from testbed.plan.collective import EVERY_STEP, Collective
from testbed.plan.model import Action, Op
from testbed.plan.schedules import Sends, reduce_actions


def lower(compute: Sequence[Action], stages: tuple[int, ...], pp: int, microbatches: int,
          replicas: int, sends: Sends = Sends.TORCH,
          gradients: Collective | None = EVERY_STEP,
          buckets: Mapping[int, int] | None = None) -> list[Action]:
    """The actions of a GPU that holds `stages` of a `pp`-stage pipeline and computes in
    the order `compute` (F, B, I, W and OVERLAP_F_B actions). `sends`: TORCH waits for
    every send at the end of the step, as torch's runtime does; EAGER never waits.
    `gradients`: what replicas all-reduce after a stage's last backward (None: nothing);
    `buckets`: in how many buckets, by stage (testbed.plan.buckets; one by default)."""
    out: list[Action] = []
    waits: list[Action] = []
    posted: list[Action] = []
    backwards = dict.fromkeys(stages, 0)
    for action in compute:
        for leaf in action.leaves:
            recv = _receive(leaf, pp)
            if recv is not None:
                out.append(recv)
        out.append(action)
        for leaf in action.leaves:
            send = _send(leaf, pp)
            if send is not None:
                out.append(send)
                if _peer(send) not in stages:
                    posted.append(send)
        for leaf in action.leaves:
            if leaf.op in (Op.B, Op.W):
                backwards[leaf.stage] += 1
                if backwards[leaf.stage] == microbatches and replicas > 1 \
                        and gradients is not None:
                    starts, ends = reduce_actions(leaf.stage, gradients,
                                                  (buckets or {}).get(leaf.stage, 1))
                    out += starts
                    waits += ends
    if sends is Sends.TORCH:
        out += [Action(s.stage, Op.WAIT_F if s.op is Op.SEND_F else Op.WAIT_B, s.microbatch)
                for s in reversed(posted)]
    out += waits
    out += [Action(stage, Op.STEP) for stage in stages]
    return out


def _receive(leaf: Action, pp: int) -> Action | None:
    """What a compute waits for: the previous stage's activations for a forward, the
    next stage's gradient for a backward's input part (none for the first stage's forward,
    the last stage's backward or a W)."""
    if leaf.op is Op.F and leaf.stage > 0:
        return Action(leaf.stage, Op.RECV_F, leaf.microbatch)
    if leaf.op in (Op.B, Op.I) and leaf.stage < pp - 1:
        return Action(leaf.stage, Op.RECV_B, leaf.microbatch)
    return None


def _send(leaf: Action, pp: int) -> Action | None:
    if leaf.op is Op.F and leaf.stage < pp - 1:
        return Action(leaf.stage, Op.SEND_F, leaf.microbatch)
    if leaf.op in (Op.B, Op.I) and leaf.stage > 0:
        return Action(leaf.stage, Op.SEND_B, leaf.microbatch)
    return None


def _peer(send: Action) -> int:
    return send.stage + (1 if send.op is Op.SEND_F else -1)
