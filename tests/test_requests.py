"""What became of every inference request: served, expired, rejected or pending, counted
in results and compare tables and listed one per line in requests.csv."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest

from testbed.inference.bubbles import BubbleBroker, request_status
from testbed.inference.workload import PrefillModel
from testbed.policy import Request, bubble_policy
from testbed.run.dilation import represented_requests

from .test_cli import call

ROOT = Path(__file__).resolve().parent.parent
FILLED = """\
name: filled
datacenters:
  - {name: east, gpus: 2, gpu: a100, bandwidth: 10Gbit, latency: 50us}
  - {name: west, gpus: 2, gpu: a100, bandwidth: 10Gbit, latency: 50us}
wan:
  - {between: [east, west], latency: 20ms, bandwidth: 1Gbit}
job:
  model: {layers: 8, hidden: 2048, heads: 16, seq_len: 1024, vocab: 32000}
  microbatch_size: 1
  microbatches: 4
  iterations: 3
  inference:
    model: {layers: 4, hidden: 1024, heads: 8, kv_heads: 1, seq_len: 2048, vocab: 32000}
    arrival_rate: 1000/s
    prompt_length: {distribution: uniform, min: 128, max: 1024}
    decode_dc: local
    deadline: 50ms
"""


def test_each_request_is_served_expired_rejected_or_pending() -> None:
    assert request_status(0.5, False, 1.0) == "served"
    assert request_status(1.5, False, 1.0) == "expired"
    assert request_status(None, True, 1.0) == "rejected"
    assert request_status(None, False, 1.0) == "pending"
    stream = iter([Request(0, 0.0, 100), Request(1, 0.1, 100), Request(2, 0.2, 100),
                   Request(3, 5.0, 100)])
    broker = BubbleBroker(bubble_policy("greedy"), stream,
                          PrefillModel({"a": 0.1, "b": 0.0, "c": 0.0}), deadline_s=2.0)
    assert [c.request.id for c in broker.on_idle("g", 3, 0.3, 0.3)] == [0]
    assert [c.request.id for c in broker.on_idle("h", 3, 1.9, 1.9)] == [1]
    broker.delivered(0, 0.5)  # within 2 s
    broker.delivered(1, 2.6)  # started in time, first token 2.5 s after arrival
    summary = broker.summary(5.5)  # request 2 waited past its deadline; 3 is queued
    assert (summary["requests"], summary["served"], summary["expired"],
            summary["rejected"], summary["pending"]) == (4, 2, 1, 1, 1)
    rows = broker.request_rows(5.5)
    assert [(r["id"], r["status"], r["gpu"]) for r in rows] == [
        (0, "served", "g"), (1, "expired", "h"), (2, "rejected", None), (3, "pending", None)]
    assert rows[1]["start_s"] == 1.9 and rows[1]["ttft_s"] == pytest.approx(2.5)
    slow = represented_requests(rows, 2)
    assert (slow[1]["arrival_s"], slow[1]["start_s"], slow[1]["ttft_s"]) == \
        pytest.approx((0.05, 0.95, 1.25))
    assert slow[2]["start_s"] is None and slow[2]["status"] == "rejected"


def test_compare_shows_served_rejected_and_expired_and_writes_requests_csv(
        tmp_path: Path) -> None:
    topology = tmp_path / "filled.yaml"
    topology.write_text(FILLED)
    out = tmp_path / "cmp"
    code, text, err = call(["compare", str(topology), "-p", "gpipe", "-b", "none",
                            "-b", "bubbletea", "--out", str(out)])
    assert code == 0, err
    header = text.splitlines()[0].split()
    assert header[header.index("served"):header.index("served") + 3] == \
        ["served", "rejected", "expired"]
    results = json.loads((out / "runs" / "gpipe+bubbletea-r1" / "results.json").read_text())
    inference = results["inference"]
    assert 0 < inference["served"] < inference["requests"] and inference["rejected"] > 0
    line = next(t for t in text.splitlines() if t.startswith("gpipe+bubbletea"))
    assert f"{inference['served']}/{inference['requests']}" in line
    with (out / "runs" / "gpipe+bubbletea-r1" / "requests.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == inference["requests"]
    counts = Counter(r["status"] for r in rows)
    assert counts["served"] + counts["expired"] == inference["served"]
    assert counts["expired"] == inference["expired"]
    assert counts["rejected"] == inference["rejected"]
    assert counts["pending"] == inference["pending"]
    for row in rows:  # started after arriving; a first token after the start
        if row["status"] in ("served", "expired"):
            assert float(row["arrival_s"]) <= float(row["start_s"]) and row["gpu"]
            assert float(row["arrival_s"]) + float(row["ttft_s"]) > float(row["start_s"])
        if row["status"] == "rejected":
            assert row["start_s"] == "" and row["ttft_s"] == ""
    saved = json.loads((out / "compare.json").read_text())
    filled = next(r for r in saved["rows"] if r["combo"] == "gpipe+bubbletea")
    assert filled["requests"]["served"] == inference["served"]
