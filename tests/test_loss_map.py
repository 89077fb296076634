"""Atlas against the DiLoCo family by predicted time to loss over a WAN grid."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

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


def test_figures_draws_the_map_when_asked(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.figures import frontier

    from .test_cli import call
    from .test_frontier import SMALL, TINY

    monkeypatch.setitem(frontier.SPACES, "coarse", TINY)
    small = tmp_path / "small.yaml"
    small.write_text(SMALL)
    out = tmp_path / "figures"
    code, said, err = call(["figures", "--conditions", str(small), "--out", str(out),
                         "--claims", "atlas_vs_dp", "--frontier", "off", "--time-to-loss",
                         "coarse", "--workers", "1", "--format", "svg"])
    assert code == 0, err
    rows = list(csv.DictReader((out / "time-to-loss.csv").open()))
    assert len(rows) == 3 * len(TINY.latencies_ms) * len(TINY.bandwidths_gbit)
    assert (out / "time-to-loss.svg").read_text().startswith("<?xml")
    assert "time to loss, " in err + said  # said as it finished
