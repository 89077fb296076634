#!/usr/bin/env python3
"""The loss model against what real compute trains: every-step data parallelism, DiLoCo
(H = 4 and 16), Streaming DiLoCo and Atlas with `--compute real` over the emulated WAN of
two-dc and paper-3dc, each method's loss per token over data parallelism's beside the
penalty the loss model predicts for its plan; the DiLoCo family's at the outer learning
rate that does best on a grid at the sources' Nesterov momentum 0.9 (their penalties are
those of a tuned outer step), its default's beside it, and its figure at plain averaging
(outer momentum 0, lr 1: every sync the workers' average, as Local SGD and FedAvg step;
Douillard et al., arXiv 2311.08105, compared it as an outer optimizer), which is run
beside the grid, never tuned on, with the model's order checked there too.

`.venv/bin/python scripts/bench_loss_real.py [--topologies two-dc,paper-3dc] [--seeds
0,1,2] [--iterations N] [--json benchmarks/loss-real.json] [--from-json F] [--lock F]`
(root: it runs the emulator; about 100 minutes of runs on two shared cores, most of
them the outer learning rates' grid). A run
already in the JSON given by `--from-json` is kept, not run again (one that failed is
tried again); the JSON is written after every run, so the benchmark can be run a topology
or a seed at a time. `--lock F` holds an exclusive lock on F during each seed's runs,
where others share the machine's emulator. `--parts ''` with `--from-json` only prints the tables.

What is run: each topology's own job, every method training the same global batch (two-dc
16 sequences a step, paper-3dc its 48) of the seeded synthetic corpus from the same seed
for the same steps (the token budget: two-dc 128 steps, paper-3dc 64, unless
`--iterations` sets both). paper-3dc's 13B model cannot train on a CPU: its
job runs with `model=tiny` (4 layers of 64, a vocabulary of 256, sequences of 32; 229,376
parameters), two-dc's model already is. Losses do not depend on timing, so every run is
undilated (`dilation` 1): a dilated one would only take longer.

The penalty is testbed.metrics.loss_penalty's, defined as the loss model defines its own
(testbed.loss.model.Penalty: a method's loss over every-step data parallelism's after the
same tokens): the mean loss of the model a method keeps at its evaluation points in the
budget's last quarter over the mean of data parallelism's at the same steps, same seed.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from statistics import mean, stdev
from typing import Any, NamedTuple

from measured_at import commit

from testbed.metrics.loss import LossPoint
from testbed.metrics.loss_penalty import (
    Ordering,
    measured_penalty,
    ordering,
    penalty_steps,
    seed_mean,
    tune,
)

ROOT = Path(__file__).resolve().parent.parent

class OuterStep(NamedTuple):
    """A DiLoCo-family run's outer optimizer: SGD's learning rate and Nesterov momentum."""

    lr: float
    momentum: float


PLAIN = OuterStep(lr=1.0, momentum=0.0)
"""Plain averaging: each sync replaces the outer model by the workers' average (Local SGD,
FedAvg), the outer optimizer DiLoCo generalises; Douillard et al. (arXiv 2311.08105)
compared it with Nesterov's and others. Run beside the grid, never tuned on it."""
PLAIN_PART = "outer_momentum=0/"
"""The part of a plain-averaging run's key in the JSON."""


class Method(NamedTuple):
    label: str
    policy: str
    options: dict[str, str]
    outer_lrs: tuple[float, ...] = ()
    """The outer learning rates tried (none: an exact method, which has no outer step)."""


METHODS: list[Method] = [
    Method("dp-across-dc", "dp-across-dc", {}),
    Method("diloco H=4", "diloco", {"inner_steps": "4"}, (0.05, 0.1, 0.15, 0.2, 0.4, 0.7)),
    Method("diloco H=16", "diloco", {"inner_steps": "16"}, (0.1, 0.2, 0.3, 0.4, 0.7)),
    Method("streaming-diloco", "streaming-diloco",
           {"inner_steps": "8", "fragments": "2", "overlap": "1"}, (0.1, 0.2, 0.3, 0.4, 0.7)),
    Method("atlas", "atlas", {}),
]
"""Each method's label, policy, options and outer learning rates; the first is the
baseline. Streaming DiLoCo as scripts/bench_diloco.py runs it on two-dc: two fragments of
2 layers (the tiny model has 4), each synced every 8 steps, overlapped by one step, mixed
in at 0.5. The DiLoCo family's outer learning rate is tuned as the loss model's sources
tuned theirs, the best on a grid at every setting (Charles et al., arXiv 2503.09799v1,
Section 5.1: 0.05-1.0 for each H, the best rising with H and M, their Figure 8): a part of
their grid (0.05 or 0.1 to 0.4), the value between the best two of that part on two-dc
(a finer step where the penalty changes fastest), and the policies' default (0.7,
DiLoCo's own at H = 500), which each row's untuned figure is measured at."""
BASELINE = METHODS[0][0]

SAME = 1e-6
"""Penalties within this of each other are one: float32 losses, summed in another order
by another placement, agree to about 1e-7."""

TOPOLOGIES: dict[str, dict[str, Any]] = {
    "two-dc": {"sets": {}, "global_batch": 16, "iterations": 128},
    "paper-3dc": {"sets": {"model": "tiny"}, "global_batch": 48, "iterations": 64,
                  "outer_lrs": {"diloco H=4": (0.1, 0.2, 0.7, 1.0),
                                "diloco H=16": (0.2, 0.4, 0.7, 1.0),
                                "streaming-diloco": (0.2, 0.4, 0.7, 1.0)}},
}
"""Each topology's `--set` overrides, the global batch every method trains (two-dc's as
scripts/bench_diloco.py trains it, so that Atlas's single pipeline sees the same batch;
paper-3dc's its job's own), the steps (paper-3dc's 12 workers take about 80 s a run
of 64 steps on two shared cores; its three times larger batch has data parallelism's
loss level by then, as two-dc's is by 128) and where a method's outer learning rates are
other than METHODS has (`outer_lrs`): paper-3dc's runs take four times two-dc's, so it
tries each method's best on two-dc of Charles et al.'s values, their next value above it
(the best rises with M, their Figure 8, and paper-3dc has three workers to two-dc's two),
the default and their greatest, 1.0 (where each did best at the default)."""


def _points(rows: Sequence[Sequence[Any]]) -> list[LossPoint]:
    """A curve as the JSON keeps it ([iteration, tokens, loss] rows) as LossPoints."""
    return [LossPoint(iteration=int(i), time_s=0.0, tokens=int(t), loss=loss)
            for i, t, loss in rows]


def _window_loss(run: Mapping[str, Any], steps: tuple[int, int]) -> float | None:
    losses = [p[2] for p in run["curve"] if steps[0] <= p[0] < steps[1]]
    return None if not losses or None in losses else mean(losses)


def outer_step(policy: str, options: Mapping[str, str]) -> OuterStep | None:
    """The outer step a policy's options train with (the policy's defaults where they
    leave it), read from the policy itself; None: a policy with no outer step."""
    from testbed.policy import training_policy

    settings: Any = getattr(training_policy(policy, dict(options)), "settings", None)
    if getattr(settings, "outer_lr", None) is None:
        return None
    return OuterStep(float(settings.outer_lr), float(settings.outer_momentum))


def grid(method: Method, topology: str) -> list[tuple[str, dict[str, str]]]:
    """The runs a method's outer learning rate is tuned on at a seed on `topology` (at the
    policy's Nesterov momentum, as the sources tuned theirs): each one's part of the run's
    key and its options. The policy's default outer learning rate runs with the method's
    own options (its key as before tuning), every other with `outer_lr` set."""
    default = outer_step(method.policy, method.options)
    lrs = TOPOLOGIES[topology].get("outer_lrs", {}).get(method.label, method.outer_lrs)
    return [("", method.options) if default is None or lr == default.lr else
            (f"outer_lr={lr:g}/", {**method.options, "outer_lr": f"{lr:g}"})
            for lr in lrs or (None,)]


def plain_averaging(method: Method) -> list[tuple[str, dict[str, str]]]:
    """A DiLoCo-family method's run at plain averaging (PLAIN), its part of the key and
    its options; none for an exact method."""
    if not method.outer_lrs:
        return []
    return [(PLAIN_PART, {**method.options, "outer_momentum": f"{PLAIN.momentum:g}",
                          "outer_lr": f"{PLAIN.lr:g}"})]


def _stats(mine: Mapping[int, Mapping[str, Any]], base: Mapping[int, Mapping[str, Any]],
           seeds: Sequence[int], steps: tuple[int, int]) -> dict[str, Any]:
    """A method's penalty at each seed against the baseline's run there, their mean,
    spread, least and most, and its loss in the window."""
    values = [measured_penalty(_points(mine[s]["curve"]), _points(base[s]["curve"]), steps)
              for s in seeds]
    done = [v for v in values if v is not None]
    first = mine[seeds[0]]
    losses = [_window_loss(mine[s], steps) for s in seeds]
    return {"seeds": values, "mean": seed_mean(values),
            "stdev": stdev(done) if len(done) == len(values) > 1 else None,
            "low": min(done) if done else None, "high": max(done) if done else None,
            "loss": seed_mean(losses), "loss_of": first["loss_of"],
            "points": sum(steps[0] <= p[0] < steps[1] for p in first["curve"]),
            "model": first["model"], "plan": first["plan"]}


FIGURES = ("mean", "stdev", "low", "high", "seeds")
"""The figures of a penalty over the seeds that the grid and plain averaging report."""


def _method_row(method: Method, runs: Sequence[Mapping[str, Any]],
                base: Mapping[int, Mapping[str, Any]], seeds: Sequence[int],
                steps: tuple[int, int]) -> dict[str, Any]:
    """A method's row: an exact method's figures; a DiLoCo-family method's at the outer
    learning rate tuned on its grid (`outer_lr`: the grid's figures, the choice and the
    untuned default's), with its figures at plain averaging beside them (never tuned on),
    or why it did not run."""
    by_step: dict[OuterStep | None, dict[int, Mapping[str, Any]]] = {}
    for run in runs:
        by_step.setdefault(outer_step(run["policy"], run["options"]), {})[run["seed"]] = run
    stats: dict[OuterStep | None, dict[str, Any]] = {}
    failed: dict[OuterStep | None, dict[int, str]] = {}
    for step, mine in by_step.items():
        why = {s: mine[s]["error"] if s in mine else "not run" for s in seeds
               if s not in mine or "error" in mine[s]}
        why.update({s: f"{BASELINE} did not run" for s in seeds
                    if s not in base and s not in why})
        if why:
            failed[step] = why
        else:
            stats[step] = _stats(mine, base, seeds, steps)
    default = outer_step(method.policy, method.options)
    if default is None:
        return stats[None] if None in stats else {"failed": failed[None]}
    tried = {step.lr: row for step, row in stats.items()
             if step is not None and step.momentum == default.momentum}
    if not tried:
        return {"failed": failed.get(default, dict.fromkeys(seeds, "not run"))}
    tuned = tune({lr: row["seeds"] for lr, row in tried.items()})
    plain: dict[str, Any] = {"outer_lr": PLAIN.lr, "outer_momentum": PLAIN.momentum}
    if PLAIN in stats:
        plain.update({k: stats[PLAIN][k] for k in FIGURES})
    else:
        plain["failed"] = failed.get(PLAIN, dict.fromkeys(seeds, "not run"))
    return {**tried[tuned["chosen"]], "outer_lr": {
        **tuned, "untuned": default.lr,
        "sweep": [{"value": lr, **{k: tried[lr][k] for k in FIGURES}} for lr in sorted(tried)],
        "failed": [{"value": step.lr, "seeds": why} for step, why in failed.items()
                   if step is not None and step.momentum == default.momentum]},
        "plain_averaging": plain}


def _untuned(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A row's figures at the policy's default outer learning rate: the row itself for an
    exact method, None where the default did not run."""
    if "outer_lr" not in row:
        return row
    tuning = row["outer_lr"]
    return next((p for p in tuning["sweep"] if p["value"] == tuning["untuned"]), None)


def _plain(row: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """A row's figures at plain averaging: the row itself for an exact method, None where
    plain averaging did not run at every seed."""
    if "outer_lr" not in row:
        return row
    plain: Mapping[str, Any] = row["plain_averaging"]
    return None if "failed" in plain else plain


def summarize(topology: Mapping[str, Any]) -> dict[str, Any]:
    """Per method: the penalty at each seed, their mean, spread, least and most, beside
    the model's, or why it did not run (a DiLoCo-family method's at its tuned outer
    learning rate, with its grid, and at plain averaging); and the ordering check over the
    methods that ran at every seed: tuned, at the policies' default outer learning rate
    and at plain averaging."""
    runs = topology["runs"]
    steps = penalty_steps(topology["iterations"])
    seeds = sorted({run["seed"] for run in runs.values()})
    base = {r["seed"]: r for r in runs.values() if r["method"] == BASELINE and "error" not in r}
    out: dict[str, Any] = {}
    for method in METHODS:
        mine = [r for r in runs.values() if r["method"] == method.label]
        if mine:
            out[method.label] = _method_row(method, mine, base, seeds, steps)
    ran = {k: v for k, v in out.items() if "failed" not in v}
    predicted = {k: v["model"]["penalty"] for k, v in ran.items()}
    check = ordering(predicted, {k: v["seeds"] for k, v in ran.items()})
    untuned = {k: _untuned(v) for k, v in ran.items()}
    plain = {k: _plain(v) for k, v in ran.items()}
    return {"methods": out, "ordering": check,
            "untuned_ordering": _ordering_of(predicted, untuned),
            "plain_averaging_ordering": _ordering_of(predicted, plain),
            "steps": list(steps), "seeds": seeds}


def _ordering_of(predicted: Mapping[str, float],
                 rows: Mapping[str, Mapping[str, Any] | None]) -> Ordering | None:
    """The ordering check of the methods' figures at one outer step; None where a method's
    did not run there at every seed."""
    done = {k: row["seeds"] for k, row in rows.items() if row is not None}
    return None if len(done) < len(rows) else ordering(predicted, done)


def _emulated(topology: str, label: str, policy: str, options: dict[str, str], seed: int,
              iterations: int, work: Path) -> dict[str, Any]:
    """One real-compute run, with the loss model's penalty for the plan it ran; a run
    that fails is recorded with its error, one stopped by Ctrl-C or SIGTERM stops the
    benchmark."""
    from testbed import api
    from testbed.emulator.runtime.coordinator.failure import Interrupted
    from testbed.emulator.runtime.worker.compute.model import entropy_floor
    from testbed.errors import TestbedError
    from testbed.policy import training_policy
    from testbed.policy.loss_models import declared_effect, loss_model

    conditions = TOPOLOGIES[topology]
    inputs = api.load(ROOT / "topologies" / f"{topology}.yaml", sets=conditions["sets"])
    job = replace(inputs.job, microbatches=None, global_batch=conditions["global_batch"],
                  iterations=iterations, seed=seed)
    inputs = replace(inputs, job=job)
    plan = api.plan(inputs, policy, options)
    effect = declared_effect(training_policy(policy, options), plan, inputs.topology)
    model = loss_model()
    predicted = model.penalty(effect, job.model.params)
    run: dict[str, Any] = {
        "topology": topology, "method": label, "policy": policy, "options": options,
        "seed": seed, "tokens_per_step": job.model.seq_len * conditions["global_batch"],
        "floor": entropy_floor(job.model.vocab), "plan": {"dp": plan.dp, "pp": plan.pp},
        "model": {"name": model.name, "effect": effect.describe(),
                  "params": job.model.params, "penalty": predicted.ratio,
                  "band": [predicted.low, predicted.high],
                  "extrapolated": predicted.extrapolated,
                  "why_extrapolated": list(predicted.reasons)}}
    run["load_before"] = os.getloadavg()[0]
    started = time.monotonic()
    try:
        result = api.emulate(inputs, policy, options, compute="real", dilation=1,
                             out=work / f"{topology}-{label.replace(' ', '_')}-{seed}",
                             say=lambda _m: None)
    except Interrupted as stopped:
        raise SystemExit(stopped.exit_code) from stopped
    except TestbedError as error:
        return {**run, "error": str(error).splitlines()[0]}
    if isinstance(result.error, Interrupted):
        raise SystemExit(result.error.exit_code)
    if result.error is not None:
        return {**run, "error": str(result.error).splitlines()[0]}
    run["wall_s"] = time.monotonic() - started
    results = result.results
    said = (results.get("loss_model") or {}).get("penalty")
    if said is None or abs(said - predicted.ratio) > 1e-12:
        raise SystemExit(f"{topology} {label}: the run's loss_model.penalty {said} is not "
                         f"the plan's {predicted.ratio}")
    synced = results.get("synced_loss_curve")
    kept = synced or results["loss_curve"] or []
    return {**run, "iterations": results["iterations"],
            "loss_of": "synchronized" if synced else "training",
            "curve": [[p["iteration"], p["tokens"], p["loss"]] for p in kept],
            "tokens_per_s": results["tokens_per_s"],
            "cpu_bound": (results.get("emulation") or {}).get("cpu_bound")}


@contextmanager
def _locked(path: Path | None) -> Iterator[None]:
    """An exclusive lock on `path` while one seed's runs go on (a few minutes), where
    others share the machine's emulator (their runs' checks for leftover processes would
    see these)."""
    if path is None:
        yield
        return
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def measure(report: dict[str, Any], topologies: Sequence[str], seeds: Sequence[int],
            steps: int | None, work: Path, lock: Path | None, save: Path | None) -> None:
    """Every run not yet in `report` (or failed there), seed by seed so that a cut-short
    benchmark has whole seeds, each seed's under `lock`, saved after each run; `steps`:
    every topology's, else each its own."""
    for topology in topologies:
        iterations = steps or TOPOLOGIES[topology]["iterations"]
        entry = report.setdefault("topologies", {}).setdefault(
            topology, {"iterations": iterations, "runs": {}})
        if entry["iterations"] != iterations:
            raise SystemExit(f"{topology}: the report's runs are of {entry['iterations']} "
                             f"steps, not {iterations}")
        entry["global_batch"] = TOPOLOGIES[topology]["global_batch"]
        entry["sets"] = TOPOLOGIES[topology]["sets"]
        for seed in seeds:
            todo = [(f"{topology}/{m.label}/{part}{seed}", m, options) for m in METHODS
                    for part, options in [*grid(m, topology), *plain_averaging(m)]]
            todo = [t for t in todo if "error" in entry["runs"].get(t[0], {"error": ""})]
            if not todo:
                continue
            waited = time.monotonic()
            with _locked(lock):
                print(f"{topology}, seed {seed}: {time.monotonic() - waited:.0f} s for the "
                      "lock", flush=True)
                for key, method, options in todo:
                    run = _emulated(topology, method.label, method.policy, options, seed,
                                    iterations, work)
                    _record(report, entry, key, run, save)


def _record(report: dict[str, Any], entry: dict[str, Any], key: str, run: dict[str, Any],
            save: Path | None) -> None:
    """One run into the report, said in a line and saved."""
    entry["runs"][key] = run
    entry["tokens_per_step"] = run["tokens_per_step"]
    entry["floor"] = run["floor"]
    if "error" in run:
        print(f"{key}: failed: {run['error']}", flush=True)
    else:
        steps = penalty_steps(entry["iterations"])
        loss = _window_loss(run, steps)
        print(f"{key}: dp {run['plan']['dp']} x pp {run['plan']['pp']}, loss "
              + ("diverged" if loss is None else f"{loss:.4f}")
              + f" over steps {steps[0]}-{steps[1] - 1}, model penalty "
              f"{run['model']['penalty']:.4f}, {run['wall_s']:.0f} s (load "
              f"{run['load_before']:.1f})", flush=True)
    report["commit"] = commit()
    if save is not None:
        save.write_text(json.dumps(report, indent=1) + "\n")


def _pct(value: float | None) -> str:
    if value is None:
        return "diverged"
    change = value - 1
    return f"{0.0 if abs(change) < 5e-5 else change:+.2%}"  # no -0.00%


def _spread(row: Mapping[str, Any]) -> str:
    """A penalty's mean ± sd over the seeds."""
    return _pct(row["mean"]) + ("" if row["stdev"] is None else f" ± {row['stdev']:.2%}")


def _lr_cells(row: Mapping[str, Any]) -> tuple[str, str, str]:
    """A row's outer learning rate, chosen of its grid, its figure untuned and its figure
    at plain averaging."""
    tuning = row.get("outer_lr")
    if tuning is None:
        return "none (exact)", _spread(row), _spread(row)
    tried = ", ".join(f"{p['value']:g}" for p in tuning["sweep"])
    untuned, plain = _untuned(row), row["plain_averaging"]
    return (f"{tuning['chosen']:g} of {tried}",
            "did not run" if untuned is None else _spread(untuned),
            _spread(plain) if "failed" not in plain else
            "not run" if set(plain["failed"].values()) == {"not run"} else "failed")


def tables(report: Mapping[str, Any]) -> str:
    """The documentation's tables, from the JSON alone: per topology, each method's
    measured penalty (mean, spread and range over seeds; the DiLoCo family's at its tuned
    outer learning rate, untuned and at plain averaging beside it) beside the model's,
    whether the model's order of the methods holds, and the outer learning rates' grid."""
    out: list[str] = []
    for name, topology in report.get("topologies", {}).items():
        summary = summarize(topology)
        first, end = summary["steps"]
        seeds = len(summary["seeds"])
        untuned = next((r["outer_lr"]["untuned"] for r in summary["methods"].values()
                        if "outer_lr" in r), None)
        out += [f"| {name}, real compute | plan | the model's effect | outer lr: chosen of "
                f"the grid | measured penalty at it: mean ± sd (range, {seeds} seeds) | "
                f"untuned (outer lr {untuned:g}) | plain averaging (momentum "
                f"{PLAIN.momentum:g}, lr {PLAIN.lr:g}) | model penalty (band) | loss, steps "
                f"{first}-{end - 1} (points) |",
                "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for label, row in summary["methods"].items():
            if "failed" in row:
                why = "; ".join(f"seed {s}: {e}" for s, e in sorted(row["failed"].items()))
                out.append(f"| {label} | did not run with real compute: {why} | | | | | | | |")
                continue
            model = row["model"]
            mark = "*" if model["extrapolated"] else ""
            loss = "diverged" if row["loss"] is None else f"{row['loss']:.4f}"
            kind, _, detail = model["effect"].partition(" (")
            chosen, untuned_cell, plain = _lr_cells(row)
            out.append(
                f"| {label} | dp {row['plan']['dp']} x pp {row['plan']['pp']} | "
                + (kind if kind == "exact" else f"{kind} {detail.removesuffix(')')}")
                + f" | {chosen} | {_spread(row)} ({_pct(row['low'])} to {_pct(row['high'])})"
                f" | {untuned_cell} | {plain} | {_pct(model['penalty'])}{mark} ("
                f"{_pct(model['band'][0])} to {_pct(model['band'][1])}) | {loss} ("
                f"{row['points']}, "
                f"{row['loss_of']}) |")
        out += ["", _verdict(name, topology, summary), "", *_sweep_table(name, summary), ""]
    runs = [r for t in report.get("topologies", {}).values() for r in t["runs"].values()
            if "error" not in r]
    if runs:
        out.append(f"{len(runs)} runs, {sum(r['wall_s'] for r in runs) / 60:.0f} minutes "
                   f"of wall time, load average {min(r['load_before'] for r in runs):.1f}-"
                   f"{max(r['load_before'] for r in runs):.1f} as they started (two cores "
                   "shared); * the model extrapolates (a 229,376-parameter model is far "
                   "below every source's).")
    return "\n".join(out).rstrip()


def _sweep_table(name: str, summary: Mapping[str, Any]) -> list[str]:
    """Each DiLoCo-family method's penalty at every outer learning rate it tried, the
    chosen one in bold."""
    tuned = {label: row["outer_lr"] for label, row in summary["methods"].items()
             if "outer_lr" in row}
    values = sorted({p["value"] for t in tuned.values() for p in t["sweep"]}
                    | {p["value"] for t in tuned.values() for p in t["failed"]})
    if not tuned:
        return []
    out = [f"| {name}: measured penalty by outer lr (mean ± sd, "
           f"{len(summary['seeds'])} seeds) | " + " | ".join(f"{v:g}" for v in values) + " |",
           "| --- |" + " --- |" * len(values)]
    for label, tuning in tuned.items():
        cells = {p["value"]: _spread(p) for p in tuning["sweep"]}
        cells.update({p["value"]: "not run" if set(p["seeds"].values()) == {"not run"}
                      else "failed" for p in tuning["failed"]})
        cells[tuning["chosen"]] = f"**{cells[tuning['chosen']]}**"
        out.append(f"| {label} | " + " | ".join(cells.get(v, "") for v in values) + " |")
    return out


def _verdict(name: str, topology: Mapping[str, Any], summary: Mapping[str, Any]) -> str:
    """The paragraph under a topology's table: the budget, both orders, whether the
    model's holds at the tuned outer learning rates, at the default one and at plain
    averaging."""
    first, end = summary["steps"]
    check = summary["ordering"]
    wrong = [p for p in check["pairs"] if not p["holds"]]
    steady = [p for p in check["pairs"] if p["every_seed"]]
    tokens = topology["iterations"] * topology["tokens_per_step"]
    text = (f"{name}: {topology['iterations']} steps of {topology['global_batch']} sequences "
            f"({tokens:,} tokens), the penalty over steps {first}-{end - 1} (the synthetic "
            f"corpus's entropy, the loss no model goes below: {topology['floor']:.3f}). ")
    if len(check["predicted"]) < 2:
        return text + "Too few methods ran at every seed to order them."
    tuned = {label: row["outer_lr"] for label, row in summary["methods"].items()
             if "outer_lr" in row}
    if tuned:
        text += "Each DiLoCo-family method at its best outer lr: " + "; ".join(
            f"{label} {t['chosen']:g}" + (" (the grid's edge: the best may lie beyond it)"
                                          if t["at_edge"] else "")
            for label, t in tuned.items()) + ". "
    rows = summary["methods"]
    predicted = {label: rows[label]["model"]["penalty"] for label in check["predicted"]}
    means = {label: rows[label]["mean"] for label in check["measured"]}
    text += (f"By loss per token the model orders {_order(check['predicted'], predicted, 0)}; "
             f"measured: {_order(check['measured'], means)}. ")
    pairs = len(check["pairs"])
    text += (f"The model's order holds (all {pairs} pairs it orders)" if check["holds"] else
             f"The model's order does not hold ({pairs - len(wrong)} of the {pairs} pairs it "
             "orders do): " + "; ".join(f"{p['lower']} measured above {p['higher']}"
                                       for p in wrong))
    text += f"; every seed orders {len(steady)} of the {pairs} pairs as the means do."
    plain = summary.get("untuned_ordering")
    if tuned and plain is not None:
        held = sum(p["holds"] for p in plain["pairs"])
        text += (f" Untuned (every outer lr the policies' default), {held} of the "
                 f"{len(plain['pairs'])} pairs hold.")
    outside = [(label, row) for label, row in summary["methods"].items()
               if "failed" not in row and row["mean"] is not None
               and not row["model"]["band"][0] - SAME <= row["mean"]
               <= row["model"]["band"][1] + SAME]
    text += (" Measured outside the model's band: " + "; ".join(
        f"{label} ({_pct(row['mean'])} against {_pct(row['model']['penalty'])})"
        for label, row in outside) + "." if outside else
        " Every measured penalty is inside the model's band.")
    for tie in check["ties"]:
        gap = tie["largest_gap"]
        text += (f" {' and '.join(tie['methods'])}, exact both, differ by at most "
                 + ("(diverged)" if gap is None else f"{gap:.1e}") + " at a seed.")
    plain = summary.get("plain_averaging_ordering")
    if tuned and plain is not None:
        means = {k: (rows[k]["plain_averaging"] if k in tuned else rows[k])["mean"]
                 for k in plain["measured"]}
        held = sum(p["holds"] for p in plain["pairs"])
        steady = [p for p in plain["pairs"] if p["every_seed"]]
        text += (f" At plain averaging (outer momentum {PLAIN.momentum:g}, lr {PLAIN.lr:g}) "
                 f"measured: {_order(plain['measured'], means)}; the model's order "
                 + ("holds" if plain["holds"] else "does not hold")
                 + f" ({held} of the {len(plain['pairs'])} pairs it orders do, every seed "
                 f"orders {len(steady)} of them as the means do).")
    return text


def _order(labels: Sequence[str], penalties: Mapping[str, float],
           within: float = SAME) -> str:
    """Methods in order, a tie (penalties `within` of each other: measured ones within
    SAME, predicted ones equal) joined by =."""
    text = labels[0] if labels else ""
    for before, label in pairwise(labels):
        tied = abs(penalties[before] - penalties[label]) <= within
        text += (" = " if tied else " < ") + label
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--topologies", default="two-dc,paper-3dc")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--iterations", type=int,
                        help="steps of every run (a multiple of 16, every method's cycle; "
                        "default: each topology's own)")
    parser.add_argument("--parts", default="emulate", help="emulate, or '' to only render")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "loss-real.json")
    parser.add_argument("--from-json", type=Path,
                        help="start from this report (its runs are kept, not run again)")
    parser.add_argument("--lock", type=Path,
                        help="hold an exclusive lock on this file during each emulated run")
    parser.add_argument("--work", type=Path, help="keep the runs' directories here")
    args = parser.parse_args()
    if args.iterations is not None and (args.iterations <= 0 or args.iterations % 16):
        parser.error("--iterations must be a positive multiple of 16 (every method's cycle)")
    topologies = [t for t in args.topologies.split(",") if t]
    unknown = [t for t in topologies if t not in TOPOLOGIES]
    if unknown:
        parser.error(f"--topologies: no conditions for {', '.join(unknown)} (known: "
                     f"{', '.join(TOPOLOGIES)})")
    report: dict[str, Any] = json.loads(args.from_json.read_text()) if args.from_json else {}
    if "emulate" in args.parts.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            measure(report, topologies,
                    [int(s) for s in args.seeds.split(",") if s], args.iterations,
                    args.work or Path(tmp), args.lock, args.json)
        for entry in report.get("topologies", {}).values():
            entry["summary"] = summarize(entry)  # for readers of the JSON; docs recompute it
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(tables(report))


if __name__ == "__main__":
    main()
