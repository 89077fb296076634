#!/usr/bin/env python3
"""The DiLoCo family against every-step data parallelism and Atlas, by time to a target
loss, tokens per second beside it: predicted by the loss model in the simulator (testbed.
loss: the time to the loss every-step data parallelism reaches at the job's token budget),
measured with real compute over the emulated WAN.

`.venv/bin/python scripts/bench_diloco.py [--parts simulate,bandwidth,emulate] [--json F]
[--plot F.png] [--from-json F] [--readme docs/diloco.md]` (`--parts ''` with `--from-json` only
renders); simulate and bandwidth take a few minutes, emulate (root) a few more.

- simulate: paper-3dc and wan-3dc in the simulator: the predicted time to loss, tokens/s,
  effective tokens/s, WAN bytes per inner step and the cycle time of dp-across-dc,
  diloco (H = 10, 50, 500), streaming-diloco (4-bit, the paper's fragments of 3 blocks,
  overlap 1), dp-compressed (int8) and Atlas.
- bandwidth: paper-3dc with every WAN link at 0.1 to 100 Gbit/s: which method reaches the
  loss first.
- emulate (root): two-dc with real compute on this CPU, the same tokens and seed for
  every method: loss against represented time, time to a target loss, WAN bytes.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from testbed import api
from testbed.experiments.sweep import vary
from testbed.metrics.loss import time_to_loss

ROOT = Path(__file__).resolve().parent.parent

METHODS: list[tuple[str, str, dict[str, str]]] = [
    ("dp-across-dc", "dp-across-dc", {}),
    ("dp-compressed int8", "dp-compressed", {"payload": "int8"}),
    ("diloco H=10", "diloco", {"inner_steps": "10"}),
    ("diloco H=50", "diloco", {"inner_steps": "50"}),
    ("diloco H=500", "diloco", {"inner_steps": "500"}),
    ("streaming-diloco", "streaming-diloco", {"outer_bits": "4"}),
    ("atlas", "atlas", {}),
]


def _simulated(inputs: api.Inputs, policy: str, options: dict[str, str],
               out: Path) -> dict[str, Any]:
    """One simulated run of at least two whole cycles (the first iteration is warm-up)."""
    plan = api.plan(inputs, policy, options)
    iterations = max(inputs.job.iterations, plan.period + 1)
    job = replace(inputs.job, iterations=iterations)
    result = api.simulate(replace(inputs, job=job), policy, options, out=out)
    results = result.results
    ahead = (results.get("loss_model") or {}).get("target") or {}
    return {
        "target_loss": ahead.get("loss"),
        "time_to_loss_s": ahead.get("time_s"),
        "time_band_s": ahead.get("time_band_s"),
        "effective_tokens_per_s": ahead.get("effective_tokens_per_s"),
        "extrapolated": ahead.get("extrapolated"),
        "penalty": (results.get("loss_model") or {}).get("penalty"),
        "tokens_per_s": results["tokens_per_s"],
        "iterations": results["iterations"],
        "period": plan.period,
        "wan_bytes_per_step": results["wan"]["bytes"] / results["iterations"],
        "cycle_s": (results.get("cycle_time_s") or {}).get("mean"),
        "gpu_utilization": results["gpu_utilization"]["training"],
    }


def simulate_part(work: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for topology in ("paper-3dc", "wan-3dc"):
        inputs = api.load(ROOT / "topologies" / f"{topology}.yaml")
        rows = {}
        for label, policy, options in METHODS:
            rows[label] = _simulated(inputs, policy, options, work / topology / label)
            print(f"{topology} {label}: {_days(rows[label]['time_to_loss_s'])} to loss "
                  f"{rows[label]['target_loss']:.4g}, {rows[label]['tokens_per_s']:.0f} "
                  f"tokens/s, {rows[label]['wan_bytes_per_step'] / 1e9:.2f} GB on the WAN "
                  "per step", flush=True)
        base = rows["dp-across-dc"]
        for row in rows.values():
            row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"]
            row["wan_bytes_vs_dp"] = row["wan_bytes_per_step"] / base["wan_bytes_per_step"]
        out[topology] = rows
    return out


def bandwidth_part(work: Path, rates: tuple[str, ...] = ("100Mbit", "1Gbit", "10Gbit",
                                                         "100Gbit")) -> dict[str, Any]:
    inputs = api.load(ROOT / "topologies" / "paper-3dc.yaml")
    out: dict[str, Any] = {}
    for rate in rates:
        topology, job = vary(inputs.topology, inputs.job, "wan.bandwidth", rate)
        at = replace(inputs, topology=topology, job=job)
        runs = {label: _simulated(at, policy, options, work / rate / label)
                for label, policy, options in METHODS}
        times = {label: run["time_to_loss_s"] for label, run in runs.items()}
        first = min(times, key=lambda label: times[label] or float("inf"))
        print(f"WAN {rate}: {first} first to the loss ({_days(times[first])})", flush=True)
        out[rate] = {"tokens_per_s": {label: run["tokens_per_s"] for label, run in runs.items()},
                     "time_to_loss_s": times, "first": first,
                     "target_loss": next(iter(runs.values()))["target_loss"]}
    return out


def _days(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds / 86400:,.1f} days"


EMULATED: list[tuple[str, str, dict[str, str]]] = [
    ("dp-across-dc", "dp-across-dc", {}),
    ("diloco H=4", "diloco", {"inner_steps": "4"}),
    ("diloco H=16", "diloco", {"inner_steps": "16"}),
    ("streaming-diloco", "streaming-diloco", {"inner_steps": "8", "fragments": "2",
                                              "overlap": "1"}),
    ("gpipe", "gpipe", {}),
    ("atlas", "atlas", {}),
]


def emulate_part(work: Path, iterations: int, target: float | None) -> dict[str, Any]:
    """Real compute on this machine's CPU over the emulated two-dc WAN: every method
    trains the same global batch (16 sequences a step) from the same seed for the same
    steps. The target loss, unless given, is the one every-step data parallelism (the
    first method) reaches three quarters of the way through its run, so that it is
    reachable and the methods that sync less are asked for the same model quality."""
    inputs = api.load(ROOT / "topologies" / "two-dc.yaml")
    job = replace(inputs.job, microbatches=None, global_batch=16, iterations=iterations)
    inputs = replace(inputs, job=job)
    out: dict[str, Any] = {}
    for label, policy, options in EMULATED:
        result = api.emulate(inputs, policy, options, compute="real",
                             out=work / label.replace(" ", "_"), say=lambda _m: None)
        results = result.results
        curve = results["loss_curve"] or []
        synced = results.get("synced_loss_curve")
        if target is None:
            target = round(curve[(3 * len(curve)) // 4 - 1]["loss"], 2)
        # the DiLoCo family is ranked by its synchronized model's loss, as results rank it
        ranked = synced or curve
        loss_of = "synchronized" if synced else "training"
        reached = time_to_loss(ranked, target, loss_of=loss_of)
        out[label] = {
            "tokens_per_s": results["tokens_per_s"],
            "loss_curve": curve,
            "synced_loss_curve": synced,
            "loss_of": loss_of,
            "time_to_loss_s": reached["time_s"],
            "final_loss": ranked[-1]["loss"] if ranked else None,
            "wan_bytes": results["wan"]["bytes"],
            "machine_bound": (results.get("emulation") or {}).get("cpu_bound"),
            "plan": {"dp": results["plan"]["dp"], "pp": results["plan"]["pp"]},
        }
        print(f"{label}: {out[label]['tokens_per_s']:,.0f} tokens/s, time to loss {target}: "
              f"{out[label]['time_to_loss_s']} s, {out[label]['wan_bytes'] / 1e6:.1f} MB on "
              "the WAN", flush=True)
    return {"target_loss": target, "iterations": iterations, "runs": out}


def plot_losses(emulated: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2), layout="constrained")
    styles = ["-", "--", "-.", (0, (1, 1)), (0, (5, 1, 1, 1, 1, 1)), (0, (3, 3))]
    for index, (label, run) in enumerate(emulated["runs"].items()):
        curve = run.get("synced_loss_curve") or run["loss_curve"] or []
        synced = bool(run.get("synced_loss_curve"))
        axes.plot([p["time_s"] for p in curve], [p["loss"] for p in curve],
                  label=label + (" (synchronized model)" if synced else ""),
                  linestyle=styles[index % len(styles)], linewidth=1.4,
                  marker="o" if synced else None, markersize=3)
    axes.axhline(emulated["target_loss"], color="grey", linestyle=":", label="target")
    axes.set_xlabel("represented time (s)")
    axes.set_ylabel("loss ranked (nats per token)")
    axes.set_title("two-dc, real compute on CPU, 16 sequences per step")
    axes.legend(fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def ranking(report: dict[str, Any]) -> str:
    """The simulated methods in order of their predicted time to loss on the first
    topology, tokens/s and effective tokens/s beside it, from the benchmark's JSON alone."""
    lines: list[str] = []
    simulated = report.get("simulate", {})
    if simulated:
        names = list(simulated)
        first = simulated[names[0]]
        target = next(iter(first.values()))["target_loss"]
        lines += ["| method | " + " | ".join(
            f"{n}: days to loss {next(iter(simulated[n].values()))['target_loss']:.4g} | "
            f"{n} tokens/s (x dp-across-dc) | {n} effective tokens/s" for n in names)
            + f" | {names[0]} WAN bytes per step (x dp-across-dc) |",
            "| --- | " + " | ".join("--- | --- | ---" for _ in names) + " | --- |"]
        order = sorted(first, key=lambda label: first[label]["time_to_loss_s"] or float("inf"))
        for label in order:
            cells = []
            for n in names:
                run = simulated[n][label]
                mark = "*" if run["extrapolated"] else ""
                cells += [_days(run["time_to_loss_s"]).removesuffix(" days") + mark,
                          f"{run['tokens_per_s']:,.0f} ({run['speedup']:.2f}x)",
                          f"{run['effective_tokens_per_s']:,.0f}"
                          if run["effective_tokens_per_s"] is not None else "-"]
            row = first[label]
            lines.append(f"| {label} | " + " | ".join(cells)
                         + f" | {row['wan_bytes_per_step'] / 1e9:.2f} GB "
                         f"({row['wan_bytes_vs_dp']:.3f}x) |")
        lines += ["", f"Rows in order of the time to loss on {names[0]}; the target is the loss "
                  f"every-step data parallelism reaches at the job's token budget ({target:.4g} "
                  "on both: 20 tokens per parameter of the 13B model), as the loss model "
                  "predicts it; * the prediction extrapolates beyond the model's sources "
                  "(see [the loss model](loss-model.md)).", ""]
    return "\n".join(lines).rstrip()


def tables(report: dict[str, Any]) -> str:
    """The documentation's tables, from the benchmark's JSON alone."""
    lines = [ranking(report), ""] if report.get("simulate") else []
    bandwidth = report.get("bandwidth", {})
    if bandwidth:
        rates = list(bandwidth)
        lines += ["| WAN link (paper-3dc): days to loss (tokens/s) | " + " | ".join(rates)
                  + " |", "| --- | " + " | ".join("---" for _ in rates) + " |"]
        for label in bandwidth[rates[0]]["tokens_per_s"]:
            cells = []
            for rate in rates:
                time = bandwidth[rate]["time_to_loss_s"][label]
                cell = (f"{_days(time).removesuffix(' days')} "
                        f"({bandwidth[rate]['tokens_per_s'][label]:,.0f})")
                cells.append(f"**{cell}**" if bandwidth[rate]["first"] == label else cell)
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        lines.append("")
    emulated = report.get("emulate")
    if emulated:
        runs = emulated["runs"]
        reference = next(iter(runs.values()))["time_to_loss_s"]
        said = any("loss_of" in run for run in runs.values())  # JSON since it was said
        lines += [f"| method (two-dc, real compute) | plan | tokens/s | time to loss "
                  f"{emulated['target_loss']} (speed-up) | loss at step "
                  f"{emulated['iterations']} | " + ("loss of | " if said else "")
                  + "WAN bytes | machine-bound |",
                  "| --- | --- | --- | --- | --- | " + ("--- | " if said else "")
                  + "--- | --- |"]
        for label, run in runs.items():
            to_loss = run["time_to_loss_s"]
            reached = "not reached" if to_loss is None else f"{to_loss:.1f} s" + (
                f" ({reference / to_loss:.2f}x)" if reference else "")
            final = run.get("final_loss")
            lines.append(
                f"| {label} | dp {run['plan']['dp']} x pp {run['plan']['pp']} | "
                f"{run['tokens_per_s']:,.0f} | {reached} | "
                + ("-" if final is None else f"{final:.2f}")
                + (f" | {run.get('loss_of', 'training')}" if said else "")
                + f" | {run['wan_bytes'] / 1e6:,.1f} MB | "
                + ("yes" if run["machine_bound"] else "no") + " |")
    return "\n".join(lines).rstrip()


def write_readme(page: Path, report: dict[str, Any], source: Path | None) -> None:
    """The tables into `page` (docs/...) between its markers, stamped with the commit
    of `source`, the JSON it came from (scripts/docs_tables.py does the same from the JSON)."""
    from docs_tables import write_block

    write_block(page, "diloco", tables(report), [] if source is None else [source])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="simulate,bandwidth")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--iterations", type=int, default=64,
                        help="emulate: inner steps of every method (a multiple of 16)")
    parser.add_argument("--target-loss", type=float,
                        help="emulate: the loss whose time is compared (default: what "
                        "dp-across-dc reaches 3/4 of the way through its run)")
    parser.add_argument("--plot", type=Path, help="emulate: loss against time, as PNG")
    parser.add_argument("--from-json", type=Path,
                        help="start from this report (parts not run keep its figures)")
    parser.add_argument("--readme", type=Path, metavar="PAGE.md",
                        help="rewrite the tables between the markers of this page "
                        "(docs/diloco.md)")
    args = parser.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    report: dict[str, Any] = json.loads(args.from_json.read_text()) if args.from_json else {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if "simulate" in parts:
            report["simulate"] = simulate_part(work / "simulate")
        if "bandwidth" in parts:
            report["bandwidth"] = bandwidth_part(work / "bandwidth")
        if "emulate" in parts:
            report["emulate"] = emulate_part(work / "emulate", args.iterations,
                                             args.target_loss)
    if args.plot and "emulate" in report:
        plot_losses(report["emulate"], args.plot)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    if args.readme:
        write_readme(args.readme, report, args.json or args.from_json)


if __name__ == "__main__":
    main()
