"""results.json's JSON Schema (draft 2020-12), made from the types of
testbed.report.run_results (testbed.common.codec converts between those types and JSON).

The schema ships as results.schema.json beside this module; `python -m
testbed.report.results_schema` writes it again after the types change (a test checks the
two agree). `validate_results` checks a results.json against the shipped schema and
refuses it in one line naming the file, the key and the problem."""

from __future__ import annotations

import dataclasses
import json
import types
from importlib.resources import files
from pathlib import Path
from typing import (
    Annotated,
    Any,
    Literal,
    NotRequired,
    Required,
    Union,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from testbed.common.codec import OMITTED, JsonObject, Open, Range, from_json
from testbed.errors import InputError
from testbed.report.launch_results import LAUNCH_SCHEMA_VERSION, LaunchResults
from testbed.report.run_results import SCHEMA_VERSION, Results

SCHEMA_FILE = "results.schema.json"
LAUNCH_SCHEMA_FILE = "launch.schema.json"
LAUNCH_KIND = "launch"
DIALECT = "https://json-schema.org/draft/2020-12/schema"
BOUNDS = ("minimum", "maximum")
_SIMPLE: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean",
                           type(None): "null"}


def json_schema(kind: Any) -> JsonObject:
    """The schema of values of a type: a dataclass or TypedDict as a closed object (its
    fields with a default of None, OMITTED ones, may be absent), list, tuple and
    dict[str, X], Literal, unions; Any (an open block) as anything."""
    origin = get_origin(kind)
    if kind is Any:
        return {}
    if kind in _SIMPLE:
        return {"type": _SIMPLE[kind]}
    if origin is Literal:
        return {"enum": list(get_args(kind))}
    if origin in (NotRequired, Required):  # a TypedDict's key: is_typeddict says which
        return json_schema(get_args(kind)[0])
    if origin is Annotated:  # a number's bounds (testbed.common.codec.Range), or OPEN
        base, *extras = get_args(kind)
        if any(isinstance(extra, Open) for extra in extras):
            return {"type": "object"}
        out = json_schema(base)
        for extra in extras:
            if isinstance(extra, Range):
                out.update(extra.schema())
        return out
    if origin in (Union, types.UnionType):
        members = [json_schema(a) for a in get_args(kind)]
        if all(set(m) <= {"type", *BOUNDS} and isinstance(m.get("type"), str)
               for m in members) and sum(len(m) > 1 for m in members) <= 1:
            # one kind's bounds bind only values of that kind: `null` passes `minimum`
            return {"type": [m["type"] for m in members],
                    **{k: v for m in members for k, v in m.items() if k != "type"}}
        return {"anyOf": members}
    if origin in (list, tuple, dict):
        return _container(origin, get_args(kind))
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        hints = get_type_hints(kind, include_extras=True)
        fields = dataclasses.fields(kind)
        return _object(kind, {f.name: hints[f.name] for f in fields},
                       [f.name for f in fields if f.metadata != OMITTED])
    if is_typeddict(kind):
        hints = get_type_hints(kind, include_extras=True)
        return _object(kind, hints, [k for k in hints if k in kind.__required_keys__])
    raise TypeError(f"no JSON Schema for {kind!r}")


def _container(origin: type, args: tuple[Any, ...]) -> JsonObject:
    """list[X]; tuple[X, ...] as a list, tuple[X, Y] as exactly those items; dict[str, X]."""
    if origin is dict:
        value = json_schema(args[1])
        return {"type": "object", **({"additionalProperties": value} if value else {})}
    if origin is list or (len(args) == 2 and args[1] is Ellipsis):
        return {"type": "array", "items": json_schema(args[0])}
    return {"type": "array", "prefixItems": [json_schema(a) for a in args],
            "minItems": len(args), "maxItems": len(args)}


def _object(kind: type, hints: dict[str, object], required: list[str]) -> JsonObject:
    out: JsonObject = {"type": "object"}
    if kind.__doc__ and not kind.__doc__.startswith(f"{kind.__name__}("):
        out["description"] = " ".join(kind.__doc__.split())
    out["properties"] = {name: json_schema(hint) for name, hint in hints.items()}
    out["required"] = required
    out["additionalProperties"] = False
    return out


def results_schema() -> JsonObject:
    """The whole document for results.json, as shipped."""
    body = json_schema(Results)
    body["properties"]["schema_version"] = {"const": SCHEMA_VERSION}
    # the version goes in $id's path: draft 2020-12 forbids a fragment there (`...#2`
    # made every stock validator refuse the schema itself)
    return {"$schema": DIALECT, "$id": f"testbed:results/{SCHEMA_VERSION}.schema.json",
            "title": "testbed results.json", "schema_version": SCHEMA_VERSION, **body}


def launch_schema() -> JsonObject:
    """The document for a launch's results.json (`"kind": "launch"`), as shipped."""
    body = json_schema(LaunchResults)
    body["properties"]["schema_version"] = {"const": LAUNCH_SCHEMA_VERSION}
    return {"$schema": DIALECT, "$id": f"testbed:launch/{LAUNCH_SCHEMA_VERSION}.schema.json",
            "title": "testbed launch results.json", "schema_version": LAUNCH_SCHEMA_VERSION,
            **body}


def schema_text(kind: str = "run") -> str:
    return json.dumps(launch_schema() if kind == LAUNCH_KIND else results_schema(),
                      indent=2) + "\n"


def shipped_schema(kind: str = "run") -> JsonObject:
    """results.schema.json (a run's) or launch.schema.json as installed with the package."""
    name = LAUNCH_SCHEMA_FILE if kind == LAUNCH_KIND else SCHEMA_FILE
    loaded: JsonObject = json.loads(
        files("testbed.report").joinpath(name).read_text(encoding="utf-8"))
    return loaded


def results_from(data: JsonObject, where: str) -> Results:
    """Parsed results.json content, checked against the shipped schema."""
    check_results(data, where)
    results: Results = from_json(data, Results, where)
    return results


def check_results(data: Any, where: str) -> None:
    """Raise a one-line InputError naming `where`, the key and the problem where `data`
    does not match results.schema.json (the most telling problem, of all there are)."""
    problems = results_problems(data, where)
    if problems:
        raise problems[0]


def results_problems(data: Any, where: str) -> list[InputError]:
    """Every way `data` does not match results.schema.json, each one line naming `where`,
    the key (a JSON path: `inference.ttft_s.p99`, `loss_curve[0].loss`) and the problem;
    the most telling first (jsonschema's best match), the rest in the schema's order."""
    import jsonschema

    if not isinstance(data, dict):
        return [InputError(f"expected a mapping, got {_kind(data)}", where)]
    kind = LAUNCH_KIND if data.get("kind") == LAUNCH_KIND else "run"
    expected = LAUNCH_SCHEMA_VERSION if kind == LAUNCH_KIND else SCHEMA_VERSION
    version = data.get("schema_version")
    if version is None:
        return [InputError(f"missing: written before testbed's results had a schema (this "
                           f"testbed reads schema_version {expected})", where,
                           "schema_version")]
    if version != expected:
        what = "a launch's results" if kind == LAUNCH_KIND else "results"
        return [InputError(f"{version!r}: written by another version of testbed (this one "
                           f"reads {what} of {expected})", where, "schema_version")]
    errors = list(jsonschema.Draft202012Validator(shipped_schema(kind)).iter_errors(data))
    best = jsonschema.exceptions.best_match(errors)
    leaves = [leaf for error in ([best] if best else []) + errors for leaf in _leaves(error)]
    located = dict.fromkeys(found for leaf in leaves for found in _located(leaf))
    return [InputError(problem, where, key or None) for key, problem in located]


def _leaves(error: Any) -> list[Any]:
    """The errors to report for one: for a value of the right kind (a list, not null) that
    is wrong inside or lacks a key, the errors of the branch of anyOf it fits, the most
    telling first; else the error itself."""
    import jsonschema

    if error.validator != "anyOf":
        return [error]
    context = list(error.context or ())
    misfits = {e.schema_path[0] for e in context  # branches of another kind than the value
               if not e.relative_path and e.validator in ("type", "enum", "const")}
    inside = [e for e in context if e.schema_path[0] not in misfits]
    if not inside:
        return [error]
    fits = max(inside, key=jsonschema.exceptions.relevance).schema_path[0]
    branch = [e for e in inside if e.schema_path[0] == fits]
    first = jsonschema.exceptions.best_match(branch)
    return [leaf for e in (first, *branch) for leaf in _leaves(e)]


def _located(error: Any) -> list[tuple[str, str]]:
    """A schema error as dotted keys (list items as [i]), each with a short problem: one
    per missing or unknown key."""
    key = ""
    for part in error.absolute_path:
        key += f"[{part}]" if isinstance(part, int) else f"{'.' if key else ''}{part}"
    schema, instance = error.schema, error.instance
    if error.validator == "required":
        return [(_join(key, name), "missing") for name in schema["required"]
                if name not in instance]
    if error.validator in BOUNDS:
        which = "at least" if error.validator == "minimum" else "at most"
        return [(key, f"must be {which} {schema[error.validator]:g}, got {_kind(instance)}")]
    if error.validator in ("minItems", "maxItems"):
        which = "too short" if error.validator == "minItems" else "too long"
        return [(key, f"{which}: {len(instance)} items, expected "
                      f"{schema[error.validator]}")]
    if error.validator == "additionalProperties":
        return [(_join(key, name), f"unknown key (not in schema_version {SCHEMA_VERSION})")
                for name in instance if name not in schema.get("properties", {})]
    return [(key, f"expected {_describe(schema)}, got {_kind(instance)}")]


def _describe(schema: JsonObject) -> str:
    if "anyOf" in schema:
        return " or ".join(_describe(s) for s in schema["anyOf"])
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    if "const" in schema:
        return json.dumps(schema["const"])
    kinds = schema.get("type", "anything")
    names = {"object": "a mapping", "array": "a list", "null": "null"}
    return " or ".join(names.get(k, k) for k in ([kinds] if isinstance(kinds, str) else kinds))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool | int | float):
        return f"{type(value).__name__} {value!r}"
    if isinstance(value, str):
        return f"text {value[:40]!r}"
    if isinstance(value, dict):
        return "a mapping"
    return "a list" if isinstance(value, list) else type(value).__name__


def _join(key: str, name: str) -> str:
    return f"{key}.{name}" if key else name


if __name__ == "__main__":
    Path(__file__).with_name(SCHEMA_FILE).write_text(schema_text())
    Path(__file__).with_name(LAUNCH_SCHEMA_FILE).write_text(schema_text(LAUNCH_KIND))
