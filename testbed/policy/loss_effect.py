"""What a plan does to the loss a token buys, read from the plan itself: the default of
`TrainingPolicy.loss_effect` (testbed.loss.effects has the kinds). A plan whose replicas
all-reduce whole dense gradients every step is exact, whatever its schedule or placement;
one with outer steps is the DiLoCo family, its M, H, fragments, overlap and payload read
from its cycle; compressed every-step gradients are their payload."""

from __future__ import annotations

from testbed.loss.effects import (
    DENSE,
    CompressedGradients,
    Exact,
    LocalSteps,
    LossEffect,
    Unmodelled,
)
from testbed.plan.action import Action, Op
from testbed.plan.collective import Collective, Reduces, Scope
from testbed.plan.model import Plan
from testbed.topology.model import Topology

_REDUCING = (Op.ALLREDUCE, Op.ALLREDUCE_START)


def effect_of(plan: Plan, topology: Topology) -> LossEffect:
    """The plan's effect on loss per token (see the module's docstring)."""
    lead = plan.lead_gpu(0, 0)
    by_iteration = [plan.steady_actions_at(i)[lead] for i in range(plan.period)]
    reductions = [a.subject for actions in by_iteration for a in actions if a.op in _REDUCING]
    gradients = [c for c in reductions if c.reduces is Reduces.GRADIENTS]
    if any(a.op is Op.OUTER_STEP for actions in by_iteration for a in actions):
        return _local_steps(plan, topology, by_iteration, gradients)
    if plan.dp == 1:
        return Exact()
    if not gradients or all(c.scope is Scope.DC for c in gradients):
        return Unmodelled("its replicas never reduce their gradients or parameters across "
                          "datacenters")
    payload = gradients[0].payload
    return Exact() if payload in DENSE else CompressedGradients(payload)


def _local_steps(plan: Plan, topology: Topology, by_iteration: list[tuple[Action, ...]],
                 gradients: list[Collective]) -> LossEffect:
    period = plan.period
    steps = [i for i, actions in enumerate(by_iteration)
             for a in actions if a.op is Op.OUTER_STEP and a.subject.fragment == 0]
    if not steps:
        return Unmodelled("its outer steps never cover the first fragment")
    deltas = next((a.subject for actions in by_iteration for a in actions
                   if a.op in _REDUCING and a.subject.reduces is Reduces.DELTAS
                   and a.subject.fragment == 0), None)
    if deltas is None:
        return Unmodelled("its outer steps average no deltas")
    started = next((i for i, actions in enumerate(by_iteration) for a in actions
                    if a.op is Op.ALLREDUCE_START and a.subject == deltas), None)
    overlap = 0 if started is None else (steps[0] - started) % period
    if any(c.scope is Scope.ALL for c in gradients):
        workers = 1  # every replica already shares every step's gradient
    elif gradients:  # reduced inside each datacenter: a worker per datacenter
        workers = len({topology.dc_of(plan.gpus_of(r, 0)[0]) for r in range(plan.dp)})
    else:
        workers = plan.dp
    fragments = deltas.fragments
    outer = plan.outer
    return LocalSteps(
        workers=workers, sync_every=max(1, period // len(steps)), fragments=fragments,
        layers_per_fragment=sum(plan.layers) / fragments if fragments > 1 else None,
        overlap=overlap, payload=deltas.payload, outer_lr=outer.lr,
        outer_momentum=outer.momentum, nesterov=outer.nesterov, mixing=outer.mixing)
