"""scripts/bench_wan_tcp.py's table: each run's WAN connections, and those whose slow start
now stops short of the window the simulator's connections reach."""

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


REPORT = {"commit": "abc", "runs": [
    {"topology": "paper-3dc", "policy": "1f1b", "iterations": 4, "emulated_s": 23.5,
     "simulated_s": 23.9, "machine_bound": False,
     "connections": [_conn(913, 586), _conn(4339, 0), _conn(None, 0)]},
    {"topology": "wan-3dc", "policy": "1f1b", "iterations": 4, "emulated_s": 16.0,
     "simulated_s": None, "machine_bound": True, "connections": [_conn(None, 0)]}]}


def test_a_threshold_below_the_models_window_stops_short_of_it(bench: ModuleType) -> None:
    assert bench.below(_conn(913, 0))
    assert not bench.below(_conn(4339, 0))  # above: its slow starts reach the window
    assert not bench.below(_conn(None, 0))  # never left slow start


def test_each_run_is_a_row(bench: ModuleType) -> None:
    rows = bench.table(REPORT).splitlines()
    assert rows[2] == ("| paper-3dc | 1f1b | 23.50 s | 23.90 s | 3 | 1 | 586 | 913-4,339 | "
                       "2,000 | 1 of 3 | no |")
    assert rows[3] == "| wan-3dc | 1f1b | 16.00 s | - | 1 | 0 | - | - | 2,000 | 0 of 1 | yes |"


def test_the_summary_counts_the_connections_that_stop_short(bench: ModuleType) -> None:
    assert bench.summary(REPORT) == (
        "Of 4 WAN connections in 2 runs, 1 ended with their slow start stopping short of "
        "the window the simulator's connections reach (at 46% of it); 1 "
        "had sent segments again.")
