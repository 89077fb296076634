"""scripts/bench_wan_tcp.py's table: each run's WAN connections, those whose slow start now
stops short of the window the simulator's connections reach before any loss, and where the
model's slow starts stop."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from .scripts import script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return script("bench_wan_tcp")


def _conn(ssthresh: int | None, retrans: int, window: float = 2000.0) -> dict[str, Any]:
    return {"host": "east-0", "peer": "central-0", "congestion": "cubic", "min_rtt_s": 0.04,
            "cwnd_segments": 1500, "ssthresh_segments": ssthresh,
            "retransmitted_segments": retrans, "bytes_sent": 10**9,
            "model_window_segments": window}


def _model(ssthresh: int | None, connections: int = 1) -> dict[str, Any]:
    return {"host": "east-0", "peer": "central-0", "congestion": "cubic", "min_rtt_s": 0.04,
            "cwnd_segments": 1500, "ssthresh_segments": ssthresh,
            "retransmitted_segments": None, "bytes_sent": None, "connections": connections}


REPORT = {"commit": "abc", "runs": [
    {"topology": "paper-3dc", "policy": "1f1b", "iterations": 4, "emulated_s": 23.5,
     "simulated_s": 23.9, "machine_bound": False,
     "connections": [_conn(913, 586), _conn(4339, 0), _conn(None, 0)],
     "model_connections": [_model(1077), _model(1509), _model(None)]},
    {"topology": "wan-3dc", "policy": "1f1b", "iterations": 4, "emulated_s": 16.0,
     "simulated_s": None, "machine_bound": True, "connections": [_conn(None, 0)]}]}


def test_a_threshold_below_the_models_window_stops_short_of_it(bench: ModuleType) -> None:
    assert bench.below(_conn(913, 0))
    assert not bench.below(_conn(4339, 0))  # above: its slow starts reach the window
    assert not bench.below(_conn(None, 0))  # never left slow start


def test_each_run_is_a_row(bench: ModuleType) -> None:
    rows = bench.table(REPORT).splitlines()
    assert rows[2] == ("| paper-3dc | 1f1b | 23.50 s | 23.90 s | 3 | 1 | 586 | 913-4,339 | "
                       "1,077-1,509 on 2 of 3 | 2,000 | 1 of 3 | no |")
    assert rows[3] == ("| wan-3dc | 1f1b | 16.00 s | - | 1 | 0 | - | - | - | 2,000 | 0 of 1 | "
                       "yes |")  # a report from before the model's column


def test_the_summary_counts_the_connections_that_stop_short(bench: ModuleType) -> None:
    assert bench.summary(REPORT) == (
        "Of 4 WAN connections in 2 runs, 1 ended with their slow start stopping short of "
        "the window the simulator's connections reach before any loss (at 46% of it); 1 "
        "had sent segments again. In the model, 2 of 3 connections ended with a slow-start "
        "threshold.")


def test_a_model_row_stands_for_its_connections(bench: ModuleType) -> None:
    """A clean path's striped connections are one row with their count."""
    run = {"model_connections": [_model(300, connections=4), _model(None, connections=2)]}
    assert bench.model_thresholds(run) == "300 on 4 of 6"
    assert bench.model_thresholds({"model_connections": [_model(None)]}) == "none"


def test_resimulating_keeps_the_emulated_runs_and_says_whose_they_are(
        bench: ModuleType) -> None:
    calls = []

    def simulate(name: str, policy: str, iterations: int) -> dict[str, Any]:
        calls.append((name, policy, iterations))
        return {"simulated_s": 25.0, "model_connections": [_model(1200)]}

    again = bench.resimulated(REPORT, simulate)
    assert calls == [("paper-3dc", "1f1b", 4), ("wan-3dc", "1f1b", 4)]
    assert again["emulated_commit"] == "abc"
    assert [r["connections"] for r in again["runs"]] == [r["connections"] for r in REPORT["runs"]]
    assert [r["simulated_s"] for r in again["runs"]] == [25.0, 25.0]
    twice = bench.resimulated({**again, "commit": "def"}, simulate)
    assert twice["emulated_commit"] == "abc"  # not the commit that simulated it last
