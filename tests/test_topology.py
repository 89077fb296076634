from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.common.yamlio import parse_yaml, to_yaml
from testbed.errors import InputError
from testbed.topology import dump_topology, load_topology, parse_topology

from .strategies import mutations, topologies

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "topologies").glob("*.yaml"))
CHECKED = sorted((ROOT / "scripts" / "fidelity_topologies").glob("*.yaml"))
"""The topologies scripts/bench_fidelity.py checks beside the shipped ones."""


@pytest.mark.parametrize("path", SHIPPED + CHECKED, ids=lambda p: p.name)
def test_shipped_topologies_load(path: Path) -> None:
    topology = load_topology(path)
    assert topology.total_gpus >= 4
    assert parse_topology(dump_topology(topology), "again") == topology


def test_paper_3dc_shape() -> None:
    topology = load_topology(Path(__file__).parent.parent / "topologies" / "paper-3dc.yaml")
    assert [dc.gpus for dc in topology.datacenters] == [4, 4, 4]
    assert all(0.01 <= link.latency_s <= 0.1 for link in topology.links)
    assert len(topology.links) == 3


@given(topologies())
def test_round_trip_through_yaml(topology: Any) -> None:
    text = to_yaml(dump_topology(topology))
    again = parse_topology(parse_yaml(text, "t.yaml"), "t.yaml")
    assert again == topology


def _base() -> dict[str, Any]:
    return {
        "name": "t",
        "datacenters": [{"name": "east", "gpus": 2}, {"name": "west", "gpus": 2}],
        "wan": [{"between": ["east", "west"], "latency": "20ms", "bandwidth": "1Gbit"}],
    }


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(InputError) as info:
        parse_topology(data, "t.yaml")
    message = str(info.value)
    assert message.startswith("t.yaml: ")
    assert "\n" not in message
    return message


def test_unknown_dc_in_link() -> None:
    data = _base()
    data["wan"][0]["between"] = ["east", "mars"]
    assert _error(data) == "t.yaml: wan[0].between: unknown datacenter 'mars'"


def test_duplicate_dc() -> None:
    data = _base()
    data["datacenters"][1]["name"] = "east"
    assert "datacenters[1].name: duplicate datacenter name 'east'" in _error(data)


def test_negative_and_missing_values() -> None:
    data = _base()
    data["wan"][0]["latency"] = "-5ms"
    assert "wan[0].latency: must not be negative" in _error(data)
    data = _base()
    del data["wan"][0]["bandwidth"]
    assert "wan[0].bandwidth: missing value" in _error(data)
    data = _base()
    data["datacenters"][0]["gpus"] = 0
    assert "datacenters[0].gpus: must be positive" in _error(data)


@pytest.mark.parametrize("name", ["East", "a-b", "averyveryverylongname", "1dc", "dc 1", ""])
def test_names_that_cannot_be_interfaces(name: str) -> None:
    data = _base()
    data["datacenters"][0]["name"] = name
    data["wan"][0]["between"][0] = name
    assert "datacenters[0].name" in _error(data)


def test_duplicate_links() -> None:
    data = _base()
    data["wan"].append({"between": ["west", "east"], "latency": "20ms", "bandwidth": "1Gbit"})
    assert "wan[1].between: duplicate of wan[0]" in _error(data)
    data["wan"][1]["bandwidth"] = "2Gbit"
    assert "asymmetric duplicate" in _error(data)


def test_unknown_key_is_named() -> None:
    data = _base()
    data["wan"][0]["latncy"] = "3ms"
    assert "wan[0].latncy: unknown key" in _error(data)


def test_disconnected_dcs() -> None:
    data = _base()
    data["wan"] = []
    assert "no WAN path between east and west" in _error(data)


def test_yaml_duplicate_keys_and_syntax(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("name: a\nname: b\ndatacenters: []\n")
    with pytest.raises(InputError, match=r"dup.yaml: line 2: YAML error: duplicate key 'name'"):
        load_topology(path)
    path.write_text("name: [unclosed\n")
    with pytest.raises(InputError, match="YAML error"):
        load_topology(path)
    with pytest.raises(InputError, match="no such file"):
        load_topology(tmp_path / "missing.yaml")


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _leaves(v, (*path, k))] + [path]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _leaves(v, (*path, i))] + [path]
    return [path]


@given(topologies(min_dcs=2), st.data())
def test_any_mutation_gives_a_clean_error_or_a_valid_topology(
    topology: Any, data: st.DataObject
) -> None:
    raw = dump_topology(topology)
    target = data.draw(st.sampled_from([p for p in _leaves(raw) if p]))
    mutated = copy.deepcopy(raw)
    node = mutated
    for part in target[:-1]:
        node = node[part]
    node[target[-1]] = data.draw(mutations())
    try:
        parse_topology(mutated, "m.yaml")
    except InputError as exc:
        assert str(exc).startswith("m.yaml")
        assert "\n" not in str(exc)


@given(topologies(min_dcs=2), st.data())
def test_deleting_a_required_key_is_an_error(topology: Any, data: st.DataObject) -> None:
    raw = dump_topology(topology)
    which = data.draw(st.sampled_from(["gpus", "name", "latency", "bandwidth", "between"]))
    mutated = copy.deepcopy(raw)
    if which in ("gpus", "name"):
        del mutated["datacenters"][0][which]
    else:
        del mutated["wan"][0][which]
    # a DC's name is required; gpus too; WAN latency, bandwidth and ends too
    with pytest.raises(InputError, match="missing value"):
        parse_topology(mutated, "m.yaml")


@pytest.mark.parametrize(("key", "value", "problem"), [
    ("latency", "1000000000ms", "wan[0].latency: must be from 0s to 10s"),
    ("bandwidth", "1bit", "wan[0].bandwidth: must be from 1Mbit to 1000Tbit"),
])
def test_values_beyond_what_the_backends_can_do_are_refused(
        key: str, value: str, problem: str) -> None:
    data = {"datacenters": [{"name": "a", "gpus": 1}, {"name": "b", "gpus": 1}],
            "wan": [{"between": ["a", "b"], "latency": "20ms", "bandwidth": "1Gbit",
                     key: value}]}
    with pytest.raises(InputError, match=re.escape(problem)):
        parse_topology(data, "t.yaml")
