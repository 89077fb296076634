"""WAN transfers held in step (testbed.metrics.lockstep): counted from spans, recorded by a
simulated run, and said beside its figures where equal shares held them so."""

from __future__ import annotations

import json
from pathlib import Path

from testbed.common.spans import Span
from testbed.metrics.lockstep import lockstep

from .test_cli import call

ROOT = Path(__file__).resolve().parent.parent


def _transfer(start: float, end: float, link: str | None = "east>west") -> Span:
    return {"gpu": "g", "kind": "transfer", "start": start, "end": end, "iteration": 0,
            "stage": 0, "link": link, "bytes": 1}


def test_transfers_that_share_a_link_and_its_instants_are_in_step() -> None:
    spans = [
        _transfer(0.0, 1.0), _transfer(0.0, 1.0),  # twins: in step
        _transfer(0.5, 2.0),  # overlaps them, starts and ends alone
        _transfer(3.0, 4.0),  # alone on its link
        _transfer(0.0, 1.0, "west>east"),  # the twins' times on another link: alone there
        _transfer(0.0, 1.0, None), _transfer(0.0, 1.0, None),  # inside a DC
        _transfer(5.0, 5.0), _transfer(5.0, 5.0),  # no time on the link
        {"gpu": "g", "kind": "send", "start": 0.0, "end": 1.0, "iteration": 0, "stage": 0,
         "link": "east>west"},
    ]
    assert lockstep(spans) == {"contended": 3, "in_step": 2}
    assert lockstep([]) == {"contended": 0, "in_step": 0}
    # one that ends as the next starts does not share the link with it
    assert lockstep([_transfer(0.0, 1.0), _transfer(1.0, 2.0)]) == {"contended": 0,
                                                                     "in_step": 0}


def test_a_simulated_run_says_when_equal_shares_held_its_replicas_in_step(
        tmp_path: Path) -> None:
    """paper-3dc's 1F1B: its four replicas' transfers share each WAN crossing and, with
    equal shares (`share=0`), start and end together (27.5 s simulated against 22.6 s
    emulated); drawn shares, the default, part them."""
    out = tmp_path / "equal"
    code, stdout, _ = call(["simulate", str(ROOT / "topologies" / "paper-3dc.yaml"),
                                "-p", "1f1b", "--jitter", "share=0", "--out", str(out)])
    assert code == 0
    assert json.loads((out / "results.json").read_text())["lockstep"] == {
        "contended": 768, "in_step": 768}
    assert "  lockstep      768 of 768 WAN transfers that shared a link ran in step" in stdout
    drawn = tmp_path / "drawn"
    code, stdout, _ = call(["simulate", str(ROOT / "topologies" / "paper-3dc.yaml"),
                                "-p", "1f1b", "--out", str(drawn)])
    assert code == 0
    assert json.loads((drawn / "results.json").read_text())["lockstep"]["in_step"] == 0
    assert "lockstep" not in stdout
