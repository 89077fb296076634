"""Mistakes in input files and flags are named as the user made them, and hostile inputs
(alias bombs, huge or endless files, absurd sizes) are refused in bounded time and space
with one short line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from testbed.errors import InputError
from testbed.experiments.inputs import load_inputs
from testbed.job.load import load_job
from testbed.topology import load_topology
from testbed.topology.cluster import parse_cluster
from testbed.topology.load import parse_topology
from testbed.topology.net_events import parse_event
from tests.test_cli import call

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


# Hostile files: bounded time, bounded message.

def _bomb(levels: int, at: str) -> str:
    """A "billion laughs": each level nine aliases of the one before."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [{','.join([f'*l{level - 1}'] * 9)}]")
    lines.append(f"{at}: *l{levels}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [7, 9])
def test_an_alias_bomb_is_refused_in_one_short_line(tmp_path: Path, levels: int) -> None:
    """Seven levels once printed a 35 MB "line" quoting the expanded value; nine reached a
    MemoryError. Aliases may stand for at most MAX_ALIAS_NODES values."""
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb(levels, "name"))
    assert path.stat().st_size < 600
    code, out, err = call(["validate", str(path)])
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and len(err) < 300, err[:300]
    assert "YAML error: aliases expand to more than 100,000 values" in err


def test_aliases_used_as_templates_still_load(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text("datacenters:\n"
                    "  - &dc {name: east, gpus: &gpus 2, gpu: a100, latency: 50us}\n"
                    "  - {name: west, gpus: *gpus, gpu: a100}\n"
                    "wan:\n  - {between: [east, west], latency: 20ms, bandwidth: 1Gbit}\n")
    topology = load_topology(path)
    assert [dc.gpus for dc in topology.datacenters] == [2, 2]


def test_a_merged_template_may_be_overridden_but_not_a_key_given_twice(tmp_path: Path) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text("datacenters:\n"
                    "  - &dc {name: east, gpus: 2, gpu: a100, latency: 50us}\n"
                    "  - {<<: *dc, name: west, gpus: 4}\n"
                    "wan:\n  - {between: [east, west], latency: 20ms, bandwidth: 1Gbit}\n")
    topology = load_topology(path)
    assert [(dc.name, dc.gpus, dc.gpu.name) for dc in topology.datacenters] == [
        ("east", 2, "a100"), ("west", 4, "a100")]
    assert topology.datacenters[1].latency_s == topology.datacenters[0].latency_s > 0
    path.write_text(path.read_text().replace("gpus: 4}", "gpus: 4, gpus: 5}"))
    assert _error(load_topology, path) == f"{path}: line 3: YAML error: duplicate key 'gpus'"


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("name: &a [*a]\n")
    assert _error(load_topology, path) == \
        f"{path}: line 1: YAML error: alias 'a' inside its own anchor"


def test_a_huge_quoted_value_is_cut_in_the_message(tmp_path: Path) -> None:
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump(_topology(name="x" * 1_000_000)))
    code, _, err = call(["validate", str(path)])
    assert code == 2 and err.count("\n") == 1 and len(err) < 600
    assert err.startswith(f"testbed: error: {path}: name: 'xxxx")
    assert err.endswith("... (999,656 more characters)\n")


def test_devices_and_huge_files_are_refused_before_reading(tmp_path: Path) -> None:
    code, _, err = call(["validate", "/dev/zero"])
    assert (code, err) == (2, "testbed: error: /dev/zero: is not a regular file (a device or "
                              "socket?)\n")
    big = tmp_path / "big.yaml"
    big.write_bytes(b"#" * (4 * 1024 * 1024 + 1))
    code, _, err = call(["validate", str(big)])
    assert (code, err) == (2, f"testbed: error: {big}: larger than 4 MiB: not an input file of "
                              "testbed\n")
    code, _, err = call(["plan", str(TWO_DC), "--load", "/dev/zero"])
    assert code == 2 and "is not a regular file" in err
    trace = {"model": "tiny", "inference": {"trace": "/dev/zero"}}
    assert _error(load_job, trace, "t.yaml") == \
        "/dev/zero: is not a regular file (a device or socket?)"


def test_a_piped_topology_is_read(tmp_path: Path) -> None:
    """A pipe (`validate <(...)`) is read like a file, within the same bound."""
    import os
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text(TWO_DC.read_text()))
    writer.start()
    inputs = load_inputs(fifo)
    writer.join()
    assert inputs.topology.total_gpus == 4


# Flags: the error names what the user typed.

@pytest.mark.parametrize(("args", "expected"), [
    (["--set", "gpu_types.h100.peak=1PFLOPS"],
     "--set: gpu_types.h100.peak: 'gpu_types' is the topology's and cannot be set here: edit "
     "the topology file (--set and sweep --vary take job keys and wan.latency, wan.bandwidth, "
     "wan.A-B.latency, tcp.wmem, dc.gpus, dcs)"),
    (["--set", "wan.bandwith=10Gbit"],
     "--set: wan.bandwith: unknown key (settable: latency, bandwidth, jitter, loss, queue; "
     "examples: wan.latency, wan.bandwidth, wan.A-B.latency, tcp.wmem, dc.gpus, dcs) (did "
     "you mean 'bandwidth'?)"),
    (["--set", "wan.east-north.latency=5ms"],
     "--set: wan.east-north.latency: no link 'east-north' (the topology's: east-west) (did "
     "you mean 'east-west'?)"),
    (["--set", "dcs=3"], "--set: dcs: expected a whole number from 1 to 2 (the topology has "
     "2 datacenters), got '3'"),
    (["--set", "modle.layers=2"], "--set: modle: unknown key (did you mean 'model'?)"),
    (["--microbatches", "0"], "--microbatches: must be positive, got 0"),
    (["--set", "microbatches=0"], "--set: microbatches: must be positive, got 0"),
    (["--dp", "0"], "--dp: must be positive, got 0"),
])
def test_a_flag_error_names_the_flag(args: list[str], expected: str) -> None:
    code, _, err = call(["validate", str(TWO_DC), *args])
    assert (code, err) == (2, f"testbed: error: {expected}\n")


def test_set_takes_job_keys_as_the_file_nests_them_too() -> None:
    assert load_inputs(TWO_DC, sets=("job.microbatches=3",)).job.microbatches == 3


def test_a_bare_number_above_one_is_explained_as_a_fraction(tmp_path: Path) -> None:
    code, _, err = call(["simulate", str(TWO_DC), "--jitter", "10", "--out", str(tmp_path / "r")])
    assert (code, err) == (2, "testbed: error: --jitter: must be at most 100%, got '10' (a bare "
                              "number is a fraction: 10% or 0.1)\n")
    data = _topology()
    data["wan"][0]["loss"] = 5
    assert _error(parse_topology, data, "t.yaml").endswith("(a bare number is a fraction: 5% "
                                                          "or 0.05)")
    code, _, err = call(["simulate", str(TWO_DC), "--jitter", "150%", "--out", str(tmp_path)])
    assert err == "testbed: error: --jitter: must be at most 100%, got '150%'\n"


# Absurd sizes: a limit, named with the key and value, well above paper scale.

@pytest.mark.parametrize(("args", "expected"), [
    (["--microbatches", "2000000"],
     "--microbatches: must be at most 1,024 (testbed's limit), got 2000000"),
    (["--iterations", "100000"],
     "--iterations: must be at most 10,000 (testbed's limit), got 100000"),
    (["--set", "global_batch=99999999999"],
     "--set: global_batch: must be at most 67,108,864 (testbed's limit), got 99999999999"),
])
def test_an_absurd_count_is_refused_naming_key_value_and_limit(
        args: list[str], expected: str) -> None:
    """`plan two-dc -p gpipe --microbatches 2000000` passed the memory check and planned
    for minutes at 3.7 GB."""
    code, out, err = call(["plan", str(TWO_DC), "-p", "gpipe", *args])
    assert (code, out, err) == (2, "", f"testbed: error: {expected}\n")


def test_microbatches_a_global_batch_makes_are_limited_once_dp_is_known() -> None:
    code, _, err = call(["plan", str(TWO_DC), "-p", "gpipe", "--set", "microbatches=",
                         "--set", "global_batch=2000000", "--set", "microbatch_size=1"])
    assert (code, err) == (2, f"testbed: error: {TWO_DC}: job.global_batch: global_batch "
                              "2000000 at dp 2 and microbatch_size 1 is 1,000,000 microbatches "
                              "per replica, more than testbed's limit of 1,024\n")


def test_gpus_are_limited_per_datacenter_and_in_all() -> None:
    data = _topology()
    data["datacenters"][0]["gpus"] = 100_000
    assert _error(parse_topology, data, "t.yaml") == \
        "t.yaml: datacenters[0].gpus: must be at most 65,536 (testbed's limit), got 100000"
    data["datacenters"][0]["gpus"] = data["datacenters"][1]["gpus"] = 40_000
    assert _error(parse_topology, data, "t.yaml") == \
        "t.yaml: datacenters: 80,000 GPUs in all, more than testbed's limit of 65,536"


def test_paper_scale_is_well_inside_the_limits(tmp_path: Path) -> None:
    """gpt3-4dc (1,024 GPUs, 32 microbatches per replica) grown 16 times, with the most
    microbatches and iterations allowed, still loads; the smallest topology plans at
    the microbatch limit."""
    text = (ROOT / "topologies" / "gpt3-4dc.yaml").read_text()
    grown = tmp_path / "grown.yaml"
    grown.write_text(text.replace("gpus: 256", "gpus: 4096"))
    inputs = load_inputs(grown, iterations=10_000, microbatches=1024)
    assert inputs.topology.total_gpus == 16_384
    assert (inputs.job.iterations, inputs.job.microbatches) == (10_000, 1024)
    code, out, err = call(["plan", str(TWO_DC), "-p", "gpipe", "--microbatches", "1024",
                           "--rows", "1"])
    assert code == 0, err
    assert "1,024 microbatches of 2 per replica" in out
