"""Mistakes in input files and flags are named as the user made them, and hostile inputs
(alias bombs, huge or endless files, absurd sizes) are refused in bounded time and space
with one short line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from testbed.errors import InputError
from testbed.job_file import load_job
from testbed.net_events import parse_event
from testbed.topology import load_topology
from testbed.topology.cluster import parse_cluster
from testbed.topology.load import parse_topology

ROOT = Path(__file__).resolve().parent.parent
TWO_DC = ROOT / "topologies" / "two-dc.yaml"


def _topology(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "datacenters": [{"name": "east", "gpus": 2, "gpu": "a100"},
                        {"name": "west", "gpus": 2, "gpu": "a100"}],
        "wan": [{"between": ["east", "west"], "latency": "20ms", "bandwidth": "1Gbit"}],
    }
    data.update(changes)
    return data


def _error(call_: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(InputError) as caught:
        call_(*args, **kwargs)
    return str(caught.value)


# A misspelled key is named, not taken for the missing one it stands for.

def test_a_misspelled_required_key_in_a_wan_link_is_named() -> None:
    data = _topology()
    data["wan"][0]["bandwith"] = data["wan"][0].pop("bandwidth")
    assert _error(parse_topology, data, "t.yaml") == \
        "t.yaml: wan[0].bandwith: unknown key (did you mean 'bandwidth'?)"


def test_a_misspelled_required_key_in_a_datacenter_is_named() -> None:
    data = _topology()
    data["datacenters"][0]["gpsu"] = data["datacenters"][0].pop("gpus")
    assert _error(parse_topology, data, "t.yaml") == \
        "t.yaml: datacenters[0].gpsu: unknown key (did you mean 'gpus'?)"


def test_a_missing_key_beside_a_similar_real_key_is_still_missing() -> None:
    """`gpu` is a key of its own: without `gpus` the error is the missing `gpus`."""
    data = _topology()
    del data["datacenters"][1]["gpus"]
    assert _error(parse_topology, data, "t.yaml") == "t.yaml: datacenters[1].gpus: missing value"


def test_an_optional_misspelled_key_gets_a_suggestion() -> None:
    data = _topology()
    data["wan"][0]["jiter"] = "1ms"
    assert _error(parse_topology, data, "t.yaml") == \
        "t.yaml: wan[0].jiter: unknown key (did you mean 'jitter'?)"
    data = _topology(nmae="x")
    assert _error(parse_topology, data, "t.yaml") == \
        "t.yaml: nmae: unknown key (did you mean 'name'?)"


def test_a_misspelled_key_in_a_job_and_its_model_is_named() -> None:
    assert _error(load_job, {"model": {"layres": 2, "hidden": 64, "heads": 4, "seq_len": 8,
                                       "vocab": 10}}, "t.yaml") == \
        "t.yaml: job.model.layres: unknown key (did you mean 'layers'?)"
    assert _error(load_job, {"model": "tiny", "iteratons": 3}, "t.yaml") == \
        "t.yaml: job.iteratons: unknown key (did you mean 'iterations'?)"
    prompt = {"distribution": "uniform", "mn": 4, "max": 8}
    assert _error(load_job, {"model": "tiny", "inference": {
        "arrival_rate": 1, "prompt_length": prompt}}, "t.yaml") == \
        "t.yaml: job.inference.prompt_length.mn: unknown key (did you mean 'min'?)"


def test_a_misspelled_key_in_an_event_and_a_cluster_is_named() -> None:
    topology = load_topology(TWO_DC)
    assert _error(parse_event, {"at": "1s", "link": "east-west", "dwon": "2s"}, topology,
                  "t.yaml", "events[0]") == \
        "t.yaml: events[0].dwon: unknown key (did you mean 'down'?)"
    cluster = {"machines": [{"name": "m1", "adress": "10.0.0.1", "dcs": ["east", "west"]}]}
    assert _error(parse_cluster, cluster, "c.yaml", topology) == \
        "c.yaml: machines[0].adress: unknown key (did you mean 'address'?)"
