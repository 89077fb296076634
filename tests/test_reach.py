"""Events and scenario entries that training never reached: a run says which, in one
warning naming them and the `--iterations` that would reach them, and in its results
(`applied`); the shipped scenarios, run as the docs run them, reach theirs."""

from __future__ import annotations

import json
import re
import shlex
import warnings
from pathlib import Path
from typing import Any

import pytest

from testbed import api, errors
from testbed.scenario.reach import Entry, iterations_to_reach, late_warning

from .test_cli import call

ROOT = Path(__file__).resolve().parent.parent
TWO = ROOT / "topologies" / "two-dc.yaml"
LOSE = ROOT / "scenarios" / "two-dc-lose-a-worker.yaml"
LATE = re.compile(r"^testbed: warning: training ended at [0-9.]+ s, before (.*) began, so "
                  r"(?:it was|they were) never applied: (.*); --iterations (\d+) would reach "
                  r"(?:it|them) \(about [0-9.e-]+ s an iteration\)$")


def _results(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "results.json").read_text())  # type: ignore[no-any-return]


def _late(err: str) -> list[re.Match[str]]:
    return [m for line in err.splitlines() if (m := LATE.match(line))]


def test_a_late_event_warns_naming_itself_and_iterations_that_reach_it(tmp_path: Path) -> None:
    code, out, err = call(["simulate", str(TWO), "-p", "gpipe", "--event",
                           "at=1s,link=east-west,down=3s", "--out", str(tmp_path / "late")])
    assert code == 0, err
    [late] = _late(err)
    assert late.group(1) == "1 event or scenario entry"
    assert late.group(2) == "event east<->west down at 1 s for 3 s"
    results = _results(tmp_path / "late")
    assert results["events"] == [{"at": "1s", "link": ["east", "west"], "down": "3s",
                                  "applied": False}]
    assert "  applied       events 0 of 1 (the rest began after training ended)" in \
        out.splitlines()
    ends = results["iteration_time_s"]["all"]
    assert sum(ends) < 1.0  # what made it late: training was over before 1 s
    suggested = late.group(3)
    code, out, err = call(["simulate", str(TWO), "-p", "gpipe", "--event",
                           "at=1s,link=east-west,down=3s", "--iterations", suggested,
                           "--out", str(tmp_path / "reached")])
    assert code == 0, err
    assert not _late(err) and "warning" not in err
    reached = _results(tmp_path / "reached")
    assert reached["events"][0]["applied"] is True
    assert sum(reached["iteration_time_s"]["all"]) > 1.0 + 3.0  # the outage was ridden out
    assert "  scenario      event: east-west down for 3s at 1s (applied)" in out.splitlines()


def test_a_late_failure_is_named_and_not_applied(tmp_path: Path) -> None:
    code, _, err = call(["simulate", str(TWO), "-p", "gpipe", "--scenario", str(LOSE),
                         "--on-failure", "restart", "--out", str(tmp_path / "run")])
    assert code == 0, err
    [late] = _late(err)
    assert late.group(2) == "worker east-1 lost at 12 s, back at 20 s"
    scenario = _results(tmp_path / "run")["scenario"]
    assert scenario["failures"] == [{"at": "12s", "worker": "east-1", "back": "20s",
                                     "applied": False}]
    assert _results(tmp_path / "run")["failures"] == []  # none happened


def test_a_failure_that_stopped_the_run_was_applied_and_warns_of_nothing(
        tmp_path: Path) -> None:
    inputs = api.load(TWO, scenario=LOSE, iterations=400)
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.TestbedWarning)
        result = api.simulate(inputs, "gpipe", out=tmp_path / "run")
    assert result.results["status"] == "failed"
    assert result.results["scenario"]["failures"][0]["applied"] is True


def test_the_api_warns_of_late_entries(tmp_path: Path) -> None:
    inputs = api.load(TWO, events=["at=5s,link=east-west,latency=50ms",
                                   "at=0s,link=east-west,latency=30ms"])
    with pytest.warns(errors.TestbedWarning, match=r"before 1 event or scenario entry "
                      r"began, .*: event east<->west latency 50 ms at 5 s; --iterations"):
        result = api.simulate(inputs, "gpipe", out=tmp_path / "run")
    assert [e["applied"] for e in result.results["events"]] == [False, True]


def _documented(page: Path) -> list[list[str]]:
    """The page's commands that run an event or a scenario (in ```sh blocks)."""
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", page.read_text(), re.S):
        for command in block.replace("\\\n", " ").splitlines():
            words = shlex.split(command)
            if words[:1] == ["testbed"] and {"--event", "--scenario"} & set(words):
                commands.append(words[1:])
    return commands


def test_the_shipped_scenarios_apply_every_entry_as_the_docs_run_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    commands = _documented(ROOT / "docs" / "scenarios.md")
    scenarios = {w for words in commands for w in words if w.startswith("scenarios/")}
    assert scenarios == {"scenarios/two-dc-wan-trace.yaml", "scenarios/two-dc-lose-a-worker.yaml"}
    assert any("--event" in words for words in commands)
    monkeypatch.chdir(ROOT)
    for i, words in enumerate(commands):
        # `up` runs the same flags in the emulator (root); the simulator runs them here
        args = ["simulate" if words[0] == "up" else words[0], *words[1:],
                "--out", str(tmp_path / str(i))]
        code, _, err = call(args)
        assert code == 0, (words, err)
        assert not _late(err), (words, err)
        results = _results(tmp_path / str(i))
        entries = results["events"] + [
            entry for section in ("traces", "stragglers", "failures")
            for entry in (results["scenario"] or {}).get(section, [])]
        assert entries and all(entry["applied"] for entry in entries), (words, entries)
        if "two-dc-lose-a-worker" in " ".join(words):
            assert [f["worker"] for f in results["failures"]] == ["east-1"]
            assert results["iterations"] == results["iterations_requested"]
        if "two-dc-wan-trace" in " ".join(words):
            assert results["scenario"]["traces"][0]["steps_applied"] > 10


def test_the_suggested_iterations_reach_past_the_entry_in_whole_cycles() -> None:
    # 3 done by 0.3 s at 0.1 s each: 12 s is 117 more, 10% beyond it 129, and one more
    assert iterations_to_reach(12.0, 3, 0.3, 0.1) == 3 + 129 + 1
    assert iterations_to_reach(12.0, 3, 0.3, 0.1, period=10) == 140
    assert iterations_to_reach(0.3, 3, 0.3, 0.1) == 4


def test_a_warning_names_a_few_entries_and_counts_the_rest() -> None:
    late = [Entry("events", float(i), f"event {i}") for i in range(6)]
    text = late_warning(late, 0.5, 80, 0.1)
    assert text == ("training ended at 0.5 s, before 6 events or scenario entries began, so "
                    "they were never applied: event 0; event 1; event 2; event 3; and 2 more; "
                    "--iterations 80 would reach them (about 0.1 s an iteration)")
    assert "\n" not in text
