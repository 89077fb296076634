"""Every default of a run is written once, in RunSpec's tree: the emulator's RunConfig,
the command-line options and the Python API take theirs from it."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from testbed import api
from testbed.cli.main import cli
from testbed.emulator.runtime.coordinator.run_config import RunConfig
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.policy import training_policy
from testbed.run.dilation import dilate_events
from testbed.run.spec import RunSpec, run_settings
from testbed.topology.net_events import NetEvent
from tests.conftest import TOPOLOGIES

SPEC = run_settings()
API_NAMES = {named.api_name: name for name, named in SPEC.items()}


def _default(name: str) -> Any:
    return SPEC[name].default


def _as_cli(value: object) -> object:
    """A RunSpec default as its command-line option writes it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


@pytest.mark.parametrize("command", ["up", "simulate", "compare"])
def test_command_line_defaults_are_run_specs(command: str) -> None:
    checked = 0
    for param in cli.commands[command].params:
        name = param.name or ""
        if name not in SPEC or SPEC[name].default is dataclasses.MISSING \
                or param.default is None or not param.show_default:
            continue
        assert param.default == _as_cli(_default(name)), (command, param.name)
        checked += 1
    assert checked >= 2


@pytest.mark.parametrize("function", [api.simulate, api.emulate, api.compare])
def test_api_defaults_are_run_specs(function: Any) -> None:
    checked = 0
    for given, param in inspect.signature(function).parameters.items():
        name = API_NAMES.get(given, given)
        if name in SPEC and SPEC[name].default is not dataclasses.MISSING \
                and param.default is not None:
            assert param.default == _default(name), (function.__name__, name)
            checked += 1
    assert checked >= 2


def test_run_config_defaults_are_run_specs() -> None:
    shared = [f for f in dataclasses.fields(RunConfig)
              if f.name in SPEC and f.default is not dataclasses.MISSING]
    assert len(shared) >= 8
    for field in shared:
        assert field.default == _default(field.name), field.name


def test_run_config_takes_every_choice_of_its_spec() -> None:
    """A spec whose every choice differs from the default reaches the emulator's config
    whole: times dilated, nothing dropped on the way."""
    inputs = load_inputs(TOPOLOGIES / "two-dc.yaml")
    chosen = training_policy("1f1b")
    plan = plan_with_simulator(chosen, inputs.topology, inputs.job)
    event = NetEvent(1.0, "east", "west", "latency", 0.05, None)
    spec = RunSpec.build("emulate", inputs.topology, inputs.job, policy="1f1b",
                         bubble_policy="greedy", bubble_options={"x": "1"}, shaper="userspace",
                         allreduce="real", stall_timeout_s=7.0, pacing=False, activations="real",
                         events=(event,), dilation=3)
    config = RunConfig.for_spec(spec, spec.topology, plan, chosen, "emulated", Path("logs"),
                                3, spec.link_events, spec.scenario)
    for field in dataclasses.fields(RunConfig):
        if field.name not in SPEC or field.name in ("topology", "job", "plan", "policy",
                                                    "compute"):
            continue
        ours = spec.setting(field.name)
        if field.name == "stall_timeout_s":
            ours *= 3
        elif field.name == "events":
            ours = dilate_events(spec.link_events, 3)
        assert getattr(config, field.name) == ours, field.name
        if field.default is not dataclasses.MISSING and field.name != "cluster":
            assert ours != field.default, f"{field.name}: the spec should differ from it"
