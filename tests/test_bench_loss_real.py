"""scripts/bench_loss_real.py's choices from runs it has made: the DiLoCo family's outer
learning rate tuned on a grid, the untuned default and plain averaging beside it, and the
tables rendered from them (the runs themselves are the emulator's, run by the
benchmark)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from testbed.policy.registry import training_policy

from .scripts import script


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return script("bench_loss_real")


def _run(method: str, policy: str, options: dict[str, str], seed: int, level: float,
         penalty: float) -> dict[str, Any]:
    """A run whose kept loss is `level` at every step (8 steps of 100 tokens)."""
    return {"method": method, "policy": policy, "options": options, "seed": seed,
            "curve": [[i, 100 * (i + 1), level] for i in range(8)], "loss_of": "training",
            "plan": {"dp": 2, "pp": 2}, "wall_s": 1.0, "load_before": 1.0,
            "model": {"penalty": penalty, "band": [penalty - 0.05, penalty + 0.05],
                      "extrapolated": True, "effect": "DiLoCo (M=2, H=4)"}}


def _topology(levels: dict[tuple[str, float | None], list[float]],
              plain: dict[str, list[float]] | None = None) -> dict[str, Any]:
    """Runs at two seeds: data parallelism's at loss 1.0, each (method, outer lr) at its
    levels (the penalty, data parallelism's being 1), each method in `plain` at its levels
    at plain averaging; the model puts H=4 below H=16."""
    methods = {"dp-across-dc": ("dp-across-dc", {}, 1.0),
               "diloco H=4": ("diloco", {"inner_steps": "4"}, 1.01),
               "diloco H=16": ("diloco", {"inner_steps": "16"}, 1.02)}
    runs: dict[str, Any] = {}
    for (label, lr), values in {("dp-across-dc", None): [1.0, 1.0], **levels}.items():
        policy, options, penalty = methods[label]
        if lr is not None:
            options = {**options, "outer_lr": f"{lr:g}"}
        for seed, level in enumerate(values):
            runs[f"t/{label}/{lr}/{seed}"] = _run(label, policy, options, seed, level,
                                                  penalty)
    for label, values in (plain or {}).items():
        policy, options, penalty = methods[label]
        for seed, level in enumerate(values):
            runs[f"t/{label}/outer_momentum=0/{seed}"] = _run(
                label, policy, {**options, "outer_momentum": "0", "outer_lr": "1"}, seed,
                level, penalty)
    return {"iterations": 8, "runs": runs, "tokens_per_step": 100, "global_batch": 4,
            "floor": 0.5}


@pytest.mark.parametrize("topology", ["two-dc", "paper-3dc"])
def test_every_grid_runs_the_policys_default_with_the_methods_own_options(
        bench: ModuleType, topology: str) -> None:
    own = bench.TOPOLOGIES[topology].get("outer_lrs", {})
    assert set(own) <= {m.label for m in bench.METHODS if m.outer_lrs}
    for method in bench.METHODS:
        runs = bench.grid(method, topology)
        if not method.outer_lrs:
            assert runs == [("", method.options)]  # an exact method: one run, its key as ever
            continue
        lrs = own.get(method.label, method.outer_lrs)
        default = training_policy(method.policy, method.options).settings.outer_lr
        assert default in lrs  # the untuned figure is always measured
        assert ("", method.options) in runs
        for part, options in runs:
            lr = training_policy(method.policy, options).settings.outer_lr
            assert bench.outer_step(method.policy, options).lr == lr
            assert part == ("" if lr == default else f"outer_lr={lr:g}/")
        assert sorted(bench.outer_step(method.policy, o).lr for _, o in runs) == sorted(lrs)
    assert bench.outer_step("dp-across-dc", {}) is None


@pytest.mark.parametrize("topology", ["two-dc", "paper-3dc"])
def test_plain_averaging_runs_beside_the_grid_never_in_it(bench: ModuleType,
                                                          topology: str) -> None:
    for method in bench.METHODS:
        plain = bench.plain_averaging(method)
        if not method.outer_lrs:
            assert plain == []  # an exact method has no outer step to average with
            continue
        [(part, options)] = plain
        settings = training_policy(method.policy, options).settings
        assert (settings.outer_lr, settings.outer_momentum) == (1.0, 0.0)
        assert bench.outer_step(method.policy, options) == bench.PLAIN
        assert options.items() >= method.options.items()
        tuned_on = bench.grid(method, topology)
        assert part not in {p for p, _ in tuned_on}  # its own key in the JSON
        # the grid is the sources' Nesterov momentum alone: plain averaging is not tuned on
        assert {bench.outer_step(method.policy, o).momentum for _, o in tuned_on} == {0.9}


def test_plain_averaging_is_reported_beside_the_tuned_row_not_chosen_as_it(
        bench: ModuleType) -> None:
    # plain averaging does best of all (0.99), and H=4's grid has a Nesterov lr of 1 too:
    # the tuned row stays the grid's best, lr 1 Nesterov's own figure is not averaging's
    topology = _topology({
        ("diloco H=4", 0.1): [1.03, 1.05], ("diloco H=4", None): [1.2, 1.3],
        ("diloco H=4", 1.0): [1.4, 1.4],
        ("diloco H=16", 0.2): [1.06, 1.06], ("diloco H=16", None): [1.1, 1.1]},
        plain={"diloco H=4": [0.99, 0.99], "diloco H=16": [0.98, 0.96]})
    summary = bench.summarize(topology)
    h4 = summary["methods"]["diloco H=4"]
    assert (h4["mean"], h4["outer_lr"]["chosen"]) == (pytest.approx(1.04), 0.1)
    assert [(p["value"], p["mean"]) for p in h4["outer_lr"]["sweep"]] == [
        (0.1, pytest.approx(1.04)), (0.7, pytest.approx(1.25)), (1.0, pytest.approx(1.4))]
    assert h4["outer_lr"]["failed"] == []
    plain = h4["plain_averaging"]
    assert (plain["outer_lr"], plain["outer_momentum"]) == (1.0, 0.0)
    assert plain["seeds"] == [pytest.approx(0.99)] * 2
    assert (plain["mean"], plain["stdev"]) == (pytest.approx(0.99), pytest.approx(0.0))
    assert (plain["low"], plain["high"]) == (pytest.approx(0.99), pytest.approx(0.99))
    assert summary["methods"]["diloco H=16"]["plain_averaging"]["mean"] == \
        pytest.approx(0.97)
    assert "plain_averaging" not in summary["methods"]["dp-across-dc"]
    # tuned, the model's order holds; at plain averaging both DiLoCo runs are below data
    # parallelism and H=16 below H=4: none of the 3 pairs holds
    assert summary["ordering"]["holds"] is True
    at_plain = summary["plain_averaging_ordering"]
    assert at_plain["measured"] == ["diloco H=16", "diloco H=4", "dp-across-dc"]
    assert (at_plain["holds"], [p["holds"] for p in at_plain["pairs"]]) == \
        (False, [False, False, False])
    said = bench.tables({"topologies": {"t": topology}})
    assert "| untuned (outer lr 0.7) | plain averaging (momentum 0, lr 1) |" in said
    assert "| +25.00% ± 7.07% | -1.00% ± 0.00% | +1.00%* (-4.00% to +6.00%) |" in said
    assert "| none (exact) | +0.00% ± 0.00% (+0.00% to +0.00%) | +0.00% ± 0.00% | " \
        "+0.00% ± 0.00% |" in said  # an exact method's every column is its own figure
    assert ("At plain averaging (outer momentum 0, lr 1) measured: diloco H=16 < diloco H=4 "
            "< dp-across-dc; the model's order does not hold (0 of the 3 pairs it orders do, "
            "every seed orders 3 of them as the means do).") in said


def test_plain_averaging_not_run_at_every_seed_is_said_and_left_out_of_its_order(
        bench: ModuleType) -> None:
    topology = _topology({("diloco H=4", None): [1.2, 1.2]}, plain={"diloco H=4": [0.99]})
    summary = bench.summarize(topology)
    assert summary["methods"]["diloco H=4"]["plain_averaging"]["failed"] == {1: "not run"}
    assert summary["plain_averaging_ordering"] is None
    assert summary["untuned_ordering"] is not None
    said = bench.tables({"topologies": {"t": topology}})
    assert "| +20.00% ± 0.00% | not run |" in said
    assert "At plain averaging" not in said
    # a report from before plain averaging ran renders as before, the column "not run"
    assert "| not run |" in bench.tables(
        {"topologies": {"t": _topology({("diloco H=4", None): [1.2, 1.2]})}})


def test_the_row_is_the_best_outer_lr_with_the_untuned_default_beside_it(
        bench: ModuleType) -> None:
    topology = _topology({
        ("diloco H=4", 0.1): [1.03, 1.05], ("diloco H=4", None): [1.2, 1.3],
        ("diloco H=4", 0.4): [1.10, 1.12],
        ("diloco H=16", 0.2): [1.06, 1.06], ("diloco H=16", None): [1.1, 1.1]})
    summary = bench.summarize(topology)
    h4 = summary["methods"]["diloco H=4"]
    assert h4["mean"] == pytest.approx(1.04)
    assert h4["outer_lr"]["chosen"] == 0.1
    assert h4["outer_lr"]["at_edge"] is True  # the grid's least: the best may be below
    assert h4["outer_lr"]["untuned"] == 0.7
    assert bench._untuned(h4)["mean"] == pytest.approx(1.25)
    assert [p["value"] for p in h4["outer_lr"]["sweep"]] == [0.1, 0.4, 0.7]
    h16 = summary["methods"]["diloco H=16"]
    assert (h16["outer_lr"]["chosen"], h16["outer_lr"]["at_edge"]) == (0.2, True)
    # tuned, H=4 (1.04) is below H=16 (1.06) as the model has it; untuned, above
    assert summary["ordering"]["holds"] is True
    assert summary["untuned_ordering"]["holds"] is False
    said = bench.tables({"topologies": {"t": topology}})
    assert "diloco H=4 0.1 (the grid's edge: the best may lie beyond it)" in said
    assert "The model's order holds (all 3 pairs it orders)" in said
    assert "Untuned (every outer lr the policies' default), 2 of the 3 pairs hold." in said
    text = bench.tables({"topologies": {"t": _topology({
        ("diloco H=4", 0.1): [1.03, 1.05], ("diloco H=4", 0.2): [1.01, 1.02],
        ("diloco H=4", None): [1.2, 1.3]})}})
    assert "| diloco H=4 | +4.00% ± 1.41% | **+1.50% ± 0.71%** | +25.00% ± 7.07% |" in text
    assert "diloco H=4 0.2." in text  # inside the grid: no edge said


def test_an_outer_lr_not_run_at_every_seed_is_not_chosen(bench: ModuleType) -> None:
    topology = _topology({("diloco H=4", 0.1): [1.0, 1.0], ("diloco H=4", None): [1.2, 1.2]})
    del topology["runs"]["t/diloco H=4/0.1/1"]
    row = bench.summarize(topology)["methods"]["diloco H=4"]
    assert row["outer_lr"]["chosen"] == 0.7
    assert row["outer_lr"]["failed"] == [{"value": 0.1, "seeds": {1: "not run"}}]
    assert "| diloco H=4 | not run | **+20.00% ± 0.00%** |" in bench.tables(
        {"topologies": {"t": topology}})


def test_a_report_with_every_grid_run_runs_only_plain_averaging(
        bench: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The emulated run is stood in for: what is checked is which runs are still to do."""
    key = "two-dc/{}/{}0"
    runs = {key.format(m.label, part): {"seed": 0} for m in bench.METHODS
            for part, _ in bench.grid(m, "two-dc")}
    report: dict[str, Any] = {"topologies": {"two-dc": {"iterations": 128, "runs": dict(runs)}}}
    made: list[tuple[str, dict[str, str]]] = []

    def emulated(topology: str, label: str, policy: str, options: dict[str, str],
                 *_: Any) -> dict[str, Any]:
        made.append((label, options))
        return {"error": "stood in", "tokens_per_step": 512, "floor": 0.9}

    monkeypatch.setattr(bench, "_emulated", emulated)
    bench.measure(report, ["two-dc"], [0], None, tmp_path, None, None)
    family = [m for m in bench.METHODS if m.outer_lrs]
    assert made == [(m.label, bench.plain_averaging(m)[0][1]) for m in family]
    kept = report["topologies"]["two-dc"]["runs"]
    assert {k: kept[k] for k in runs} == runs
    assert set(kept) - set(runs) == {key.format(m.label, bench.PLAIN_PART) for m in family}
