"""A run's settings by name: the fields of the spec's sections (testbed.run.spec), each
documented once, by the docstring under it, and given on a command line as its `Setting`
(the field's metadata) says. The commands' options (testbed.cli.spec_options) and the
Python API's parameters (testbed.api) are made from these, so that a setting has one
name, one default, one text and one parser wherever it is given."""

from __future__ import annotations

import ast
import inspect
import itertools
import textwrap
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, dataclass, fields
from functools import cache
from typing import Any, Literal

from testbed.errors import InputError

Command = Literal["up", "simulate", "compare", "sweep"]
"""The commands a setting is given to (`up` is also the API's `emulate`)."""


@dataclass(frozen=True)
class Setting:
    """How a field is given on a command line and to the API (the field's docstring is
    its help)."""

    flags: tuple[str, ...]
    """The option's names, the long one last (`-p`, `--policy`)."""
    commands: frozenset[Command]
    """The commands (and so the API's functions) that take it."""
    metavar: str | None = None
    parse: Callable[[str], Any] | None = None
    """The option's text as the field's value, or a one-line InputError naming the flag;
    None: the text is the value. The API reads a text it is given so too."""
    multiple: bool = False
    """`KEY=VALUE`, repeatable: the field is the mapping they make."""
    file: bool = False
    """The option names a file (given to `parse`, or to the command, as a Path)."""
    minimum: int | None = None
    """The least whole number the option takes."""
    shown: str | None = None
    """"": --help shows no default (the field's is "never"); None: the field's own."""
    api: str | None = None
    """The API's name for it, where that is not the field's."""

    @property
    def flag(self) -> str:
        return self.flags[-1]


def setting(*flags: str, commands: tuple[Command, ...], **more: Any) -> dict[str, Setting]:
    """A field's metadata: given as `flags` to `commands` (see `Setting`)."""
    return {"setting": Setting(flags, frozenset(commands), **more)}


@dataclass(frozen=True)
class Named:
    """One setting of a run: its section's field name, its field, and how it is given."""

    name: str
    section: str
    field: Field[Any]
    hint: Any
    doc: str
    """The docstring under the field, as one paragraph."""

    @property
    def setting(self) -> Setting | None:
        found: Setting | None = self.field.metadata.get("setting")
        return found

    @property
    def default(self) -> Any:
        if self.field.default is not MISSING:
            return self.field.default
        if self.field.default_factory is not MISSING:
            return self.field.default_factory()
        return MISSING

    @property
    def api_name(self) -> str:
        return (self.setting.api if self.setting else None) or self.name

    def takes(self, command: Command) -> bool:
        return self.setting is not None and command in self.setting.commands


def settings_of(spec: type[Any], sections: tuple[str, ...]) -> dict[str, Named]:
    """Every field of `spec`'s `sections` (fields whose type is a dataclass of settings),
    by name: names are unique across them, so a setting is given by name alone."""
    hints = typing.get_type_hints(spec)
    out: dict[str, Named] = {}
    for section in sections:
        kind = hints[section]
        docs = field_docs(kind)
        inner = typing.get_type_hints(kind)
        for f in fields(kind):
            if f.name in out:
                raise TypeError(f"{f.name} is in {out[f.name].section} and {section}")
            out[f.name] = Named(f.name, section, f, inner[f.name], docs.get(f.name, ""))
    return out


@cache
def field_docs(kind: type[Any]) -> dict[str, str]:
    """The docstring under each field of a dataclass (as the source writes it: Python
    keeps no attribute docstrings), each as one paragraph."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(kind)))
    body = tree.body[0].body if isinstance(tree.body[0], ast.ClassDef) else []
    out: dict[str, str] = {}
    for item, after in itertools.pairwise(body):
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) \
                and isinstance(after.value.value, str):
            out[item.target.id] = " ".join(after.value.value.split())
    return out


def checked(named: Named, value: object, where: str) -> Any:
    """`value` given to the API for `named`: as it is where the field's type admits it, a
    text read as its option reads it, else a one-line InputError naming `where`."""
    if _admits(named.hint, value):
        return value
    parse = named.setting.parse if named.setting else None
    if isinstance(value, str) and parse is not None:
        try:
            return parse(value)
        except InputError as exc:  # said of the option: said of the parameter instead
            if exc.source != named.setting.flag:  # type: ignore[union-attr]
                raise
            raise InputError(exc.problem, None, where) from None
    if named.setting is not None and named.setting.multiple and isinstance(value, Mapping):
        return {str(k): str(v) for k, v in value.items()}
    raise InputError(f"expected {_describe(named.hint)}, got {type(value).__name__} "
                     f"{value!r}", None, where)


def _admits(hint: Any, value: object) -> bool:
    """Whether `value` is of `hint`, as far as the settings' types go (no generics'
    contents but mappings of texts)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_admits(arg, value) for arg in typing.get_args(hint))
    if origin is Literal:
        return value in typing.get_args(hint)
    if origin is typing.Annotated:
        return _admits(typing.get_args(hint)[0], value)
    if hint is type(None) or hint is None:
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is dict:
        key, item = typing.get_args(hint)
        return isinstance(value, dict) and all(
            _admits(key, k) and (item is not str or isinstance(v, str))
            for k, v in value.items())
    if origin is tuple:
        return isinstance(value, tuple)
    return isinstance(value, origin or hint)


def _describe(hint: Any) -> str:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arg) for arg in typing.get_args(hint))
    if origin is Literal:
        return " or ".join(map(repr, typing.get_args(hint)))
    if origin is typing.Annotated:
        return _describe(typing.get_args(hint)[0])
    if hint is type(None):
        return "None"
    if origin is dict:
        return "a mapping of texts"
    name = getattr(origin or hint, "__name__", str(hint))
    return f"{'an' if name[:1] in 'aeiou' else 'a'} {name}"
