"""The options of the commands that run (`up`, `simulate`, `compare`, `sweep`), made from
the run's spec (testbed.run.spec): each setting a command takes is an option named, typed,
parsed and documented by its field, so the commands, the Python API and the spec cannot
drift apart. An option left out of a command line is absent from what it gives: the
field's default applies."""

from __future__ import annotations

import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

import click
from click.core import ParameterSource

from testbed.common.choices import values_of
from testbed.policy import parse_options
from testbed.policy.option_parsers import option_text
from testbed.run.settings import Command, Named
from testbed.run.spec import run_settings

F = TypeVar("F", bound=Callable[..., Any])


def spec_options(command: Command) -> Callable[[F], F]:
    """An option for each setting `command` takes, in the spec's order."""
    taken = [named for named in run_settings().values() if named.takes(command)]

    def decorate(func: F) -> F:
        for named in reversed(taken):
            func = setting_option(named.name)(func)
        return func

    return decorate


def given_settings(command: Command, values: dict[str, Any]) -> dict[str, Any]:
    """The settings the command line gave, popped from the command's keyword arguments
    (`values`, click's), as the spec's fields take them (keyword arguments, each its
    field's type); those it did not give are left out."""
    context = click.get_current_context()
    out = {}
    for named in run_settings().values():
        if not named.takes(command):
            continue
        value = values.pop(named.name)
        if context.get_parameter_source(named.name) is not ParameterSource.COMMANDLINE:
            continue
        out[named.name] = dict(parse_options(value)) if named.setting and \
            named.setting.multiple else value
    return out


def setting_option(name: str, dest: str | None = None) -> Callable[[F], F]:
    """The option of one setting, its value under `dest` (default: the field's name): the
    field's default where the option is not given."""
    named = run_settings()[name]
    setting = named.setting
    assert setting is not None, f"{name} has no option"
    shown = _shown(named)
    kwargs: dict[str, Any] = {"help": named.doc, "metavar": setting.metavar,  # click.option's
                              "default": shown, "show_default": shown is not None}
    kind = _choices(named.hint)
    if setting.multiple:
        kwargs.update(multiple=True)
    elif setting.file:
        kwargs.update(type=click.Path(dir_okay=False, path_type=Path))
    elif kind is not None:
        kwargs.update(type=click.Choice(kind))
    elif setting.minimum is not None:
        kwargs.update(type=click.IntRange(min=setting.minimum))
    elif setting.parse is None and _base(named.hint) in (int, float):
        kwargs.update(type=_base(named.hint), default=named.default)
    if setting.parse is not None:
        kwargs.update(callback=_parsed(setting.parse))
    return click.option(*setting.flags, dest or name, **kwargs)


def _parsed(parse: Callable[[str], Any]) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        return None if value is None else parse(str(value))

    return callback


def _shown(named: Named) -> str | None:
    """The field's default as its option takes it (`on` for a switch), and --help shows
    it; None for a field whose default is nothing to show."""
    default = named.default
    if default is None or default == {} or default == () or (
            named.setting is not None and named.setting.shown == ""):
        return None
    return option_text(default)


def _choices(hint: Any) -> list[str] | None:
    """A closed choice's values (a Literal), or None."""
    if typing.get_origin(hint) is Literal:
        return values_of(hint)
    if hint is bool:
        return ["on", "off"]
    return None


def _base(hint: Any) -> Any:
    """`float` of `float | None`."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if len(args) == 1 else hint
