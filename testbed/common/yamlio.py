"""YAML in and out, strict: duplicate keys and syntax errors are located one-line errors,
and a document is bounded: the file's size, how deep it nests, and how far its aliases
expand."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from testbed.common.input_files import MAX_NESTING, MAX_YAML_BYTES, read_input
from testbed.errors import InputError

MAX_ALIAS_NODES = 100_000
"""Nodes that aliases may stand for in one document, counted expanded. Aliases share
what they name, so a few hundred bytes of nested aliases ("billion laughs") stand for
billions of values; anything that walks them (an error quoting one, a copy) would take
minutes and gigabytes. Templates for a hundred datacenters need a few thousand."""


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML keeps the last),
    an alias inside its own anchor, aliases standing for more than MAX_ALIAS_NODES, and
    nodes nested more than MAX_NESTING deep (composing recurses)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._nodes = 0
        """Nodes composed so far, an alias counting as the nodes it stands for."""
        self._aliased = 0
        self._anchored: dict[str, int] = {}
        """Nodes each finished anchor stands for."""
        self._depth = 0
        """Lists and mappings the node being composed is inside."""
        self._reach = 0
        """The deepest level of lists and mappings reached inside the node being composed
        (an alias reaching as deep below it as its anchor does)."""
        self._heights: dict[str, int] = {}
        """Levels of lists and mappings inside each finished anchor, its own included."""

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event: yaml.Event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent):
            size = self._anchored.get(event.anchor or "")
            if size is None and event.anchor in self.anchors:
                raise _refused(f"alias {event.anchor!r} inside its own anchor", event)
            self._nodes += size or 0
            self._aliased += size or 0
            if self._aliased > MAX_ALIAS_NODES:
                raise _refused(f"aliases expand to more than {MAX_ALIAS_NODES:,} values", event)
            self._nested(self._depth + self._heights.get(event.anchor or "", 0), event)
            return super().compose_node(parent, index)
        collection = isinstance(event, yaml.CollectionStartEvent)
        self._nested(self._depth + collection, event)
        before, outer = self._nodes, self._reach
        self._reach = self._depth = self._depth + collection
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= collection
        height, self._reach = self._reach - self._depth, max(outer, self._reach)
        self._nodes += 1
        if isinstance(event, yaml.NodeEvent) and event.anchor is not None:
            self._anchored[event.anchor] = self._nodes - before
            self._heights[event.anchor] = height
        return node

    def _nested(self, depth: int, event: yaml.Event) -> None:
        """Refuse a node `depth` levels of lists and mappings deep, past MAX_NESTING."""
        if depth > MAX_NESTING:
            raise _refused(f"nested deeper than {MAX_NESTING} levels of lists and mappings",
                           event)
        self._reach = max(self._reach, depth)


def _refused(problem: str, event: yaml.Event) -> yaml.composer.ComposerError:
    mark: Any = event.start_mark
    return yaml.composer.ComposerError(None, None, problem, mark)


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    """A key given twice in the mapping's own text is refused; one that a merge (`<<:
    *template`) brings in may be given again, and the mapping's own value wins."""
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "mapping key is not a plain value", key_node.start_mark
            ) from None
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def parse_yaml(text: str, source: str | None) -> Any:
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}" if mark is not None else None
        problem = (exc.problem or str(exc)).strip()
        raise InputError(f"YAML error: {problem}", source, where) from None
    except yaml.YAMLError as exc:
        raise InputError(f"YAML error: {str(exc).splitlines()[0]}", source) from None


def read_yaml(path: str | Path) -> Any:
    return parse_yaml(read_input(path, MAX_YAML_BYTES), str(path))


def to_yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100)
