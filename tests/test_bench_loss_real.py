"""scripts/bench_loss_real.py's choices from runs it has made: the DiLoCo family's outer
learning rate tuned on a grid, the untuned default beside it, and the tables rendered
from them (the runs themselves are the emulator's, run by the benchmark)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from testbed.policy.registry import training_policy

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_loss_real",
                                                  ROOT / "scripts" / "bench_loss_real.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_loss_real"] = module
    spec.loader.exec_module(module)
    return module


def _run(method: str, policy: str, options: dict[str, str], seed: int, level: float,
         penalty: float) -> dict[str, Any]:
    """A run whose kept loss is `level` at every step (8 steps of 100 tokens)."""
    return {"method": method, "policy": policy, "options": options, "seed": seed,
            "curve": [[i, 100 * (i + 1), level] for i in range(8)], "loss_of": "training",
            "plan": {"dp": 2, "pp": 2}, "wall_s": 1.0, "load_before": 1.0,
            "model": {"penalty": penalty, "band": [penalty - 0.05, penalty + 0.05],
                      "extrapolated": True, "effect": "DiLoCo (M=2, H=4)"}}


def _topology(levels: dict[tuple[str, float | None], list[float]]) -> dict[str, Any]:
    """Runs at two seeds: data parallelism's at loss 1.0, each (method, outer lr) at its
    levels (the penalty, data parallelism's being 1); the model puts H=4 below H=16."""
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
            assert bench.outer_lr(method.policy, options) == lr
            assert part == ("" if lr == default else f"outer_lr={lr:g}/")
        assert sorted(bench.outer_lr(method.policy, o) for _, o in runs) == sorted(lrs)
    assert bench.outer_lr("dp-across-dc", {}) is None


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
