"""Finding a loss model: the built-in `published` one (testbed.loss.published), or a
researcher's own fitted model installed under the entry-point group `testbed.loss_models`.
Only the model asked for is imported; whatever it raises, or any answer that is not a
finite loss inside its own band, is a plugin error naming it."""

from __future__ import annotations

import math
from collections.abc import Sequence
from importlib.metadata import entry_points
from typing import Any

from testbed.errors import InputError, PluginError, did_you_mean
from testbed.loss.effects import (
    CompressedGradients,
    Exact,
    LocalSteps,
    LossEffect,
    Unmodelled,
)
from testbed.loss.model import Estimate, LossModel, Penalty
from testbed.loss.published import NAME as PUBLISHED
from testbed.loss.published import PublishedModel
from testbed.plan.model import Plan
from testbed.policy.base import TrainingPolicy
from testbed.policy.guard import plugin_code
from testbed.topology.model import Topology

LOSS_GROUP = "testbed.loss_models"
DEFAULT_LOSS_MODEL = PUBLISHED
REQUIRED = ("synchronous", "penalty", "floor", "irreducible")


def declared_effect(policy: TrainingPolicy, plan: Plan, topology: Topology) -> LossEffect:
    """The policy's `loss_effect` for its plan, run as plugin code and checked."""
    with plugin_code(f"policy {policy.name!r} failed in loss_effect", type(policy).__module__):
        effect = policy.loss_effect(plan, topology)
    if not isinstance(effect, Exact | LocalSteps | CompressedGradients | Unmodelled):
        raise PluginError(f"policy {policy.name!r}: loss_effect returned "
                          f"{type(effect).__name__}, not Exact, LocalSteps, "
                          "CompressedGradients or Unmodelled")
    return effect


def check_reachable(model: LossModel, target: float, where: str = "target_loss") -> None:
    """A target the model's synchronous curve can approach at some size: refused in one
    line when it is below the model's irreducible loss."""
    floor = model.irreducible()
    if target <= floor:
        raise InputError(f"loss {target:g} is below {floor:g}, the irreducible loss of the "
                         f"loss model {model.name!r}: no model size or token count reaches "
                         "it", where)


def loss_model_names() -> list[str]:
    """The built-in model and every installed one, without importing any."""
    return [PUBLISHED, *sorted({e.name for e in entry_points(group=LOSS_GROUP)} - {PUBLISHED})]


def loss_model(name: str = DEFAULT_LOSS_MODEL) -> LossModel:
    """The model `name`: the built-in one, or the installed plugin of that name (only it
    is imported), wrapped so that its crashes and impossible answers name it."""
    if name == PUBLISHED:
        return PublishedModel()
    entries = [e for e in entry_points(group=LOSS_GROUP) if e.name == name]
    if not entries:
        names = loss_model_names()
        raise InputError(f"unknown loss model {name!r}{did_you_mean(name, names)}; "
                         f"installed: {', '.join(names)}", "--loss-model")
    entry = entries[-1]
    with plugin_code(f"loss model {name!r} failed to load", entry.module):
        made = entry.load()()
    missing = [m for m in REQUIRED if not callable(getattr(made, m, None))]
    if missing:
        raise PluginError(f"loss model {name!r} ({entry.value}) lacks "
                          f"{', '.join(missing)}")
    return Guarded(made, name, entry.module)


class Guarded:
    """A plugin's model, each call run as plugin code and its answer checked."""

    def __init__(self, model: Any, name: str, module: str) -> None:
        self._model = model
        self._module = module
        self.name = name
        found = getattr(model, "sources", ())
        self.sources: Sequence[str] = tuple(str(s) for s in found) \
            if isinstance(found, list | tuple) else ()

    def _call(self, what: str, *args: Any) -> Any:
        with plugin_code(f"loss model {self.name!r} failed in {what}", self._module):
            return getattr(self._model, what)(*args)

    def synchronous(self, params: float, tokens: float) -> Estimate:
        answer = self._call("synchronous", params, tokens)
        estimate: Estimate = self._checked(answer, Estimate, "synchronous", answer.loss
                                           if isinstance(answer, Estimate) else None)
        return estimate

    def penalty(self, effect: LossEffect, params: float) -> Penalty:
        answer = self._call("penalty", effect, params)
        penalty: Penalty = self._checked(answer, Penalty, "penalty", answer.ratio
                                         if isinstance(answer, Penalty) else None)
        return penalty

    def floor(self, params: float) -> float:
        return self._number(self._call("floor", params), "floor")

    def irreducible(self) -> float:
        return self._number(self._call("irreducible"), "irreducible")

    def _number(self, value: Any, what: str) -> float:
        if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
            raise PluginError(f"loss model {self.name!r}: {what} answered {value!r}, not a "
                              "positive number")
        return float(value)

    def _checked(self, answer: Any, kind: type[Any], what: str, middle: float | None) -> Any:
        if not isinstance(answer, kind) or middle is None:
            raise PluginError(f"loss model {self.name!r}: {what} answered "
                              f"{type(answer).__name__}, not a {kind.__name__}")
        low, high = answer.low, answer.high
        if not all(isinstance(v, int | float) and math.isfinite(v) and v > 0
                   for v in (low, middle, high)) or not low <= middle <= high:
            raise PluginError(f"loss model {self.name!r}: {what} answered {middle!r} with "
                              f"band {low!r}-{high!r}: not positive numbers around it")
        return answer
