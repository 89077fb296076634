"""Which connections are paced, and how fast: the rule both backends share."""

from __future__ import annotations

import pytest

from testbed.plan.pacing import PACING_SHARE, paced, pair_pacing_bytes_per_s
from testbed.report.compare import Row, markdown_table, table_text
from testbed.sim.network import INITIAL_WINDOW, Pair
from testbed.topology import parse_topology

TOPOLOGY = parse_topology({
    "datacenters": [{"name": "a", "gpus": 1}, {"name": "b", "gpus": 1},
                    {"name": "c", "gpus": 1}],
    "wan": [{"between": ["a", "b"], "latency": "20ms", "bandwidth": "1Gbit"},
            {"between": ["b", "c"], "latency": "1ms", "bandwidth": "1Gbit", "queue": "1MiB"}],
}, "t.yaml")


def test_connections_share_the_path_rate() -> None:
    assert pair_pacing_bytes_per_s(1e9, 4) * 4 * 8 == pytest.approx(PACING_SHARE * 1e9)
    assert pair_pacing_bytes_per_s(1e9, 0) == pytest.approx(PACING_SHARE * 1e9 / 8)


def test_only_messages_that_can_overflow_a_queue_are_paced() -> None:
    bdp = TOPOLOGY.link("a", "b").bdp_bytes  # 5 MB: the default queue
    assert not paced(TOPOLOGY, "a", "a", 10**9)  # inside a DC: never
    assert not paced(TOPOLOGY, "a", "b", bdp)
    assert paced(TOPOLOGY, "a", "b", bdp + 1)
    # the smallest queue on the path decides
    assert paced(TOPOLOGY, "a", "c", 2 * 2**20)
    assert not paced(TOPOLOGY, "a", "c", 2**20)


def test_simulated_paced_flow_spreads_a_window_over_a_tenth_of_a_round_trip() -> None:
    pair = Pair(2, 4 * 2**20, 0.04, False, paced=True)
    assert pair.cwnd == INITIAL_WINDOW
    assert pair.paced_cap() == pytest.approx(10 * 2 * INITIAL_WINDOW * 8 / 0.04)


def _row(predicted: float | None, bound: bool = False) -> Row:
    return Row("gpipe", 1, 0, 1.0, 1.0, 1.0, 1.0, 100.0, 0.2, 0.2, 0.3, None, None, None,
               predicted=predicted, dilation=2 if predicted else None, machine_bound=bound)


def test_emulated_comparisons_show_the_prediction_and_dilation() -> None:
    text = table_text([_row(0.9, bound=True)])
    header, _, row = text.splitlines()[:3]
    for name, value in (("simulated (s)", "0.900"), ("dilation", "2"), ("machine-bound", "yes")):
        assert row[header.index(name):].split()[0] == value  # each under its own header
    assert "| 0.900 | 2 | yes |" in markdown_table([_row(0.9, bound=True)])
    assert "| 0.900 | 2 | no |" in markdown_table([_row(0.9)])
    assert "simulated" not in table_text([_row(None)])
    assert "simulated" not in markdown_table([_row(None)])
