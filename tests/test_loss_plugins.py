"""A researcher's own loss model: found by name under testbed.loss_models, only it
imported, its answers checked, its crashes reported by its name; and a policy's own
declaration of what its plan does to the loss."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest

from testbed import api
from testbed.errors import InputError, PluginError
from testbed.loss.effects import Exact, LocalSteps, LossEffect
from testbed.loss.model import Estimate, Penalty
from testbed.policy import loss_models
from testbed.policy.loss_models import LOSS_GROUP, declared_effect, loss_model

ROOT = Path(__file__).resolve().parent.parent


class Flat:
    """Loss 3 whatever happens, DiLoCo 10% worse: a model one can check by hand."""

    name = "flat"
    sources = ("a fit of my own",)

    def synchronous(self, params: float, tokens: float) -> Estimate:
        loss = 2.0 + 1e3 / tokens ** 0.5
        return Estimate(loss, loss * 0.99, loss * 1.01, False)

    def penalty(self, effect: LossEffect, params: float) -> Penalty:
        ratio = 1.1 if isinstance(effect, LocalSteps) else 1.0
        return Penalty(ratio, ratio, ratio, False)

    def floor(self, params: float) -> float:
        return 2.0

    def irreducible(self) -> float:
        return 2.0


class Broken(Flat):
    name = "broken"

    def synchronous(self, params: float, tokens: float) -> Estimate:
        raise KeyError("oops")


class Lying(Flat):
    name = "lying"

    def synchronous(self, params: float, tokens: float) -> Estimate:
        return Estimate(3.0, 3.5, 4.0, False)  # the loss outside its own band


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Three models in a module of their own, registered as entry points; the names of
    the modules imported while the test runs."""
    module = types.ModuleType("my_loss_fits")
    module.Flat, module.Broken, module.Lying = Flat, Broken, Lying  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "my_loss_fits", module)
    entries = [EntryPoint(name, f"my_loss_fits:{cls}", LOSS_GROUP)
               for name, cls in (("flat", "Flat"), ("broken", "Broken"), ("lying", "Lying"))]
    loaded: list[str] = []

    class Loading(EntryPoint):
        def load(self) -> Any:
            loaded.append(self.name)
            return super().load()

    watched = [Loading(e.name, e.value, e.group) for e in entries]
    monkeypatch.setattr(loss_models, "entry_points",
                        lambda group: [e for e in watched if e.group == group])
    yield loaded


def test_a_model_is_loaded_by_name_and_only_it(installed: list[str]) -> None:
    model = loss_model("flat")
    assert installed == ["flat"]
    assert model.name == "flat" and list(model.sources) == ["a fit of my own"]
    assert model.synchronous(1e9, 1e6).loss == pytest.approx(3.0)
    assert "flat" in loss_models.loss_model_names()


def test_an_unknown_model_is_one_line(installed: list[str]) -> None:
    with pytest.raises(InputError, match=r"unknown loss model 'flot' \(did you mean 'flat'"):
        loss_model("flot")
    assert installed == []


def test_a_crash_or_an_impossible_answer_names_the_model(installed: list[str]) -> None:
    with pytest.raises(PluginError, match=r"loss model 'broken' failed in synchronous: "
                                          "KeyError: 'oops'"):
        loss_model("broken").synchronous(1e9, 1e9)
    with pytest.raises(PluginError, match=r"loss model 'lying': synchronous answered 3.0 "
                                          "with band 3.5-4.0"):
        loss_model("lying").synchronous(1e9, 1e9)


def test_a_run_takes_its_prediction_from_the_model_asked_for(installed: list[str],
                                                              tmp_path: Path) -> None:
    inputs = api.load(ROOT / "topologies" / "two-dc.yaml", iterations=2)
    spec = api.RunSpec.build("simulate", inputs.topology, inputs.job, policy="gpipe",
                             target_loss=2.5, loss_model="flat")
    result = api.run(spec, tmp_path / "run")
    block = result.results["loss_model"]
    assert block["name"] == "flat" and block["sources"] == ["a fit of my own"]
    assert block["target"]["tokens"] == pytest.approx(4e6, rel=1e-6)  # 2 + 1000/sqrt(4e6)
    assert result.results["time_to_loss"]["basis"] == "predicted"
    with pytest.raises(InputError, match="below 2, the irreducible loss of the loss model "
                                         "'flat'"):
        api.run(api.RunSpec.build("simulate", inputs.topology, inputs.job, policy="gpipe",
                                  target_loss=1.9, loss_model="flat"), tmp_path / "low")


def test_a_policy_declares_its_own_effect_or_is_told_it_is_wrong() -> None:
    from testbed.policy.registry import training_policy

    inputs = api.load(ROOT / "topologies" / "two-dc.yaml")
    policy = training_policy("gpipe")
    plan = api.plan(inputs, "gpipe")
    assert declared_effect(policy, plan, inputs.topology) == Exact()

    class Claims(type(policy)):  # type: ignore[misc]
        def loss_effect(self, plan: Any, topology: Any) -> Any:
            return "exact"

    with pytest.raises(PluginError, match="loss_effect returned str"):
        declared_effect(Claims(), plan, inputs.topology)
