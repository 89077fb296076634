"""A large run's outputs: spans kept as rows of GPU groups, spans.json and the trace
written from them, and a trace a viewer can open at any scale."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from testbed import api
from testbed.common.span_table import SpanTable
from testbed.errors import InputError
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.metrics.summary import summarize
from testbed.policy import training_policy
from testbed.report.chrome import SUMMARY_GPUS
from testbed.report.profile import read_spans
from testbed.report.saved import per_gpu, read_span_rows
from testbed.sim.simulator import Simulator

from .test_sim import _cli

ROOT = Path(__file__).resolve().parent.parent


def gpt3(directory: Path, gpus: int, microbatches: int = 2) -> Path:
    """GPT-3 175B on `gpus` H100s in four DCs (tp 8, pp 16), as the speed benchmark
    runs it, written where a test can simulate it."""
    text = (ROOT / "topologies" / "gpt3-4dc.yaml").read_text()
    text = text.replace("gpus: 256", f"gpus: {gpus // 4}").replace(
        "dp: 8", f"dp: {gpus // 128}").replace(
        "global_batch: 256", f"global_batch: {gpus // 128 * microbatches}").replace(
        "iterations: 2", "iterations: 1")
    path = directory / f"gpt3-{gpus}.yaml"
    path.write_text(text)
    return path


def _simulated(path: Path) -> tuple[Any, Any, SpanTable]:
    inputs = load_inputs(path)
    policy = training_policy("1f1b")
    plan = plan_with_simulator(policy, inputs.topology, inputs.job)
    return inputs, plan, Simulator(inputs.topology, inputs.job, plan, policy).run().spans


def test_a_tensor_parallel_group_is_one_row_and_reads_as_a_span_per_gpu(tmp_path: Path
                                                                          ) -> None:
    _, plan, table = _simulated(gpt3(tmp_path, 256))
    spans = list(table)
    groups = [row[0] for row in table.rows()]
    assert len(table) == len(spans) and len(groups) < len(spans) / 2
    assert {len(group) for group in groups} == {1, 8}  # messages go from the lead
    forward = next(s for s in spans if s["kind"] == "forward")
    assert set(forward) >= {"gpu", "kind", "start", "end", "iteration", "stage", "microbatch"}
    assert table[5] == spans[5] and table[-1] == spans[-1]
    # the summary reads the rows and comes out as from a span per GPU, to the bit
    args = (plan.used_gpus(), 0.0, 1000, 1e11)
    assert summarize(table, *args) == summarize(spans, *args)
    assert list(SpanTable.__iter__(_rebuilt(spans))) == spans


def _rebuilt(spans: list[Any]) -> SpanTable:
    table = SpanTable()
    table.extend(spans)
    return table


def test_spans_json_holds_each_group_once_and_reads_back_per_gpu(tmp_path: Path) -> None:
    result = api.simulate(api.load(gpt3(tmp_path, 256)), "1f1b", out=tmp_path / "run")
    path = tmp_path / "run" / "spans.json"
    start, saved = read_span_rows(path)
    assert start == 0.0 and any("gpus" in row for row in saved)
    assert len(saved) < len(result.record.spans) / 2
    assert per_gpu(saved) == json.loads(json.dumps(list(result.record.spans)))
    assert read_spans(path) == per_gpu(saved)  # what `testbed profile` reads
    # a span of one GPU is written as it always was; only a group names its GPUs
    assert all(("gpu" in row) != ("gpus" in row) for row in saved)
    assert all(len(row["gpus"]) > 1 for row in saved if "gpus" in row)


@pytest.mark.parametrize(("row", "problem"), [
    ({"gpus": "east-0"}, "spans[0].gpus: expected a list, got str"),
    ({"gpus": []}, "spans[0].gpus: expected at least one GPU"),
    ({"gpus": ["east-0", 3]}, "spans[0].gpus[1]: expected text, got int"),
    ({}, "spans[0].gpu: missing"),
])
def test_a_damaged_group_is_one_located_error(tmp_path: Path, row: dict[str, Any],
                                               problem: str) -> None:
    path = tmp_path / "spans.json"
    path.write_text(json.dumps({"start": 0, "spans": [
        {"kind": "forward", "start": 0, "end": 1, "iteration": 0, **row}]}))
    with pytest.raises(InputError, match=r"spans\.json") as caught:
        read_span_rows(path)
    assert problem in str(caught.value)


def _trace(directory: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = json.loads(
        gzip.decompress((directory / "trace.json.gz").read_bytes()))["traceEvents"]
    return events


def _tracks(events: list[dict[str, Any]]) -> set[str]:
    return {e["args"]["name"] for e in events if e["name"] == "thread_name"}


def test_the_default_trace_of_a_large_run_is_a_summary_that_says_what_it_left_out(
        tmp_path: Path) -> None:
    topology = gpt3(tmp_path, 4096)  # 32 replicas of 16 stages of 8 GPUs
    code, _, err = _cli(["simulate", str(topology), "--out", str(tmp_path / "summary")])
    assert code == 0, err
    events = _trace(tmp_path / "summary")
    tracks = _tracks(events)
    assert len(tracks) == SUMMARY_GPUS == 16 * 16  # 16 whole replicas, a lead GPU each
    assert "trace: 256 tracks of 4,096 GPUs, replicas 0-15 of 32 (the lead GPU of each " \
        "tensor-parallel group); --trace full draws every GPU" in err
    results = json.loads((tmp_path / "summary" / "results.json").read_text())
    assert results["trace"]["detail"] == "summary" and "replicas 0-15" in \
        results["trace"]["left_out"]
    # every span of a kept track is there, and every arrow joins two kept tracks
    for event in events:
        if event["ph"] in ("s", "f"):
            assert event["tid"] <= len(tracks)
    spans = json.loads((tmp_path / "summary" / "spans.json").read_text())["spans"]
    forwards = [s for s in spans if s["kind"] == "forward"
                and (s.get("gpu") or s["gpus"][0]) in tracks]
    assert sum(e.get("cat") == "forward" for e in events) == len(forwards)


def test_a_summary_trace_fills_its_tracks_where_gpus_hold_two_stages(tmp_path: Path
                                                                   ) -> None:
    """Two stages per GPU: a replica takes half as many tracks as it has stages, so twice
    as many whole replicas fit (not half the tracks left empty)."""
    from testbed.report.chrome import trace_scope

    inputs = load_inputs(gpt3(tmp_path, 4096))
    plan = plan_with_simulator(training_policy("interleaved-1f1b", {"virtual": "2"}),
                               inputs.topology, inputs.job)
    assert plan.pp == 32 and plan.dp == 32  # 16 GPU groups per replica, two stages each
    kept, said = trace_scope(plan, "summary")
    assert kept is not None and len(kept) == SUMMARY_GPUS == 16 * 16
    assert said is not None and "replicas 0-15 of 32" in said


def test_a_full_trace_draws_every_gpu_and_none_writes_none(tmp_path: Path) -> None:
    topology = gpt3(tmp_path, 512)
    code, _, err = _cli(["simulate", str(topology), "--trace", "full",
                         "--out", str(tmp_path / "full")])
    assert code == 0, err
    assert len(_tracks(_trace(tmp_path / "full"))) == 512 and "trace:" not in err
    code, _, err = _cli(["simulate", str(topology), "--trace", "none",
                         "--out", str(tmp_path / "none")])
    assert code == 0, err
    assert not (tmp_path / "none" / "trace.json.gz").exists()
    assert (tmp_path / "none" / "results.json").exists()


def test_a_small_run_is_drawn_whole(tmp_path: Path) -> None:
    code, _, err = _cli(["simulate", str(ROOT / "topologies" / "paper-3dc.yaml"), "-p", "gpipe",
                         "--iterations", "2", "--out", str(tmp_path / "run")])
    assert code == 0, err
    assert _tracks(_trace(tmp_path / "run")) == {f"{dc}-{i}" for dc in ("east", "central",
                                                                         "west")
                                                 for i in range(4)}
    assert "trace:" not in err
