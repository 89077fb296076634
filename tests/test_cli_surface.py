"""The surface a user meets, frozen: `--help` of the commands that run (`up`, `simulate`,
`compare`, `sweep`) and the signatures of the Python API's functions that run, all made
from the run's spec (testbed.run.spec). A change to an option or a parameter fails here
until the snapshot is written again, on purpose and in the same change:

    .venv/bin/python -m tests.test_cli_surface

writes tests/cli_surface.txt from the code; the diff is the change to the surface."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import pytest

from testbed import api
from testbed.cli.main import cli
from testbed.errors import InputError
from testbed.run.spec import RunSpec, run_settings

SNAPSHOT = Path(__file__).resolve().parent / "cli_surface.txt"
COMMANDS = ("up", "simulate", "compare", "sweep")
FUNCTIONS: tuple[Callable[..., Any], ...] = (api.simulate, api.emulate, api.compare)
WIDTH = 100
"""The help's width, whatever the terminal's."""


def surface() -> str:
    """Each command's help and each function's signature, one parameter a line."""
    out: list[str] = []
    for name in COMMANDS:
        command = cli.commands[name]
        parent = click.Context(cli, info_name="testbed",  # -h as well, as a user has it
                               **{**cli.context_settings, "terminal_width": WIDTH,
                                  "max_content_width": WIDTH})
        context = click.Context(command, parent=parent, info_name=name,
                                terminal_width=WIDTH, max_content_width=WIDTH)
        out += [f"=== testbed {name} --help", command.get_help(context), ""]
    for function in FUNCTIONS:
        out.append(f"=== api.{function.__name__}")
        for parameter in inspect.signature(function).parameters.values():
            line = f"    {parameter.name}: {parameter.annotation}"
            default = parameter.default
            if default is not parameter.empty:  # a function by its name, not its address
                line += f" = {default.__name__ if callable(default) else repr(default)}"
            out.append(line)
        out.append("")
    return "\n".join(out)


def test_the_commands_and_the_api_are_as_the_snapshot_freezes_them() -> None:
    assert SNAPSHOT.read_text() == surface(), (
        "the commands' options or the API's parameters changed: if on purpose, "
        "`.venv/bin/python -m tests.test_cli_surface` writes tests/cli_surface.txt again")


def test_each_setting_is_one_option_and_one_parameter_made_from_its_field() -> None:
    """Every setting a command takes is that command's option, with the field's text as
    its help, and the matching API function's keyword with the field's default."""
    functions = {"up": api.emulate, "simulate": api.simulate, "compare": api.compare}
    checked = 0
    for named in run_settings().values():
        setting = named.setting
        if setting is None:
            continue
        assert named.doc, f"{named.name} has no docstring: its option would have no help"
        for command in setting.commands:
            [option] = [p for p in cli.commands[command].params if p.name == named.name]
            assert setting.flag in option.opts and option.help == named.doc
            function = functions.get(command)
            if function is not None:
                parameter = inspect.signature(function).parameters[named.api_name]
                if named.name not in ("policy", "policy_options"):  # written in the head
                    assert parameter.default == named.default, (command, named.name)
            checked += 1
    assert checked >= 30


def test_settings_are_given_by_name_into_their_sections() -> None:
    from testbed.experiments.inputs import load_inputs
    from tests.conftest import TOPOLOGIES

    inputs = load_inputs(TOPOLOGIES / "two-dc.yaml")
    spec = RunSpec.build("emulate", inputs.topology, inputs.job, policy="atlas", dilation=4,
                         jitter=None, trace="full")
    assert (spec.common.policy, spec.emulate.dilation, spec.common.trace) == \
        ("atlas", 4, "full")
    assert spec.with_settings(dilation=2).emulate == \
        spec.emulate.__class__(dilation=2)
    assert spec.setting("dilation") == 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.common.policy = "gpipe"  # type: ignore[misc]
    with pytest.raises(InputError, match=r"^--dilation: must be a whole number from 1"):
        spec.with_settings(dilation=0)  # refused as it is made, not when it runs
    with pytest.raises(TypeError, match="no setting 'dilatoin'"):
        spec.with_settings(dilatoin=2)


if __name__ == "__main__":
    SNAPSHOT.write_text(surface())
    print(f"wrote {SNAPSHOT}")
