"""Atlas against the DiLoCo family by predicted time to loss over a WAN grid."""

from __future__ import annotations

import csv
from pathlib import Path

from testbed.figures.charts import loss_map_plot
from testbed.figures.loss_map import loss_map, summary
from testbed.topology import load_topology

ROOT = Path(__file__).resolve().parent.parent


def test_each_cell_names_the_fastest_to_the_target_and_its_margin(tmp_path: Path) -> None:
    topology = load_topology(ROOT / "topologies" / "two-dc.yaml")
    cells = loss_map(topology, (20.0,), (0.1, 10.0), workers=1)
    assert [(c.point.latency_ms, c.point.bandwidth_gbit) for c in cells] == [(20, 0.1),
                                                                           (20, 10)]
    for cell in cells:
        assert [e.policy for e in cell.entrants] == ["atlas", "diloco", "streaming-diloco"]
        timed = [e.time_s for e in cell.entrants if e.time_s is not None]
        assert cell.winner is not None and cell.winner.time_s == min(timed)
        assert cell.margin is not None and cell.margin >= 1.0
        assert cell.target is not None  # the default: the synchronous loss at the budget
    assert len({c.target for c in cells}) == 1
    assert summary(cells).startswith("fastest to the target loss: ")
    path = tmp_path / "time-to-loss.png"
    loss_map_plot(cells, "two-dc", path)
    rows = list(csv.DictReader(path.with_suffix(".csv").open()))
    assert path.stat().st_size > 0 and len(rows) == 6
    assert sum(r["winner"] == "True" for r in rows) == 2
