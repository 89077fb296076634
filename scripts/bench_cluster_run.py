#!/usr/bin/env python3
"""A training run across machines against the same run on one machine and the simulator
(needs root).

`.venv/bin/python scripts/bench_cluster_run.py [TOPOLOGY] [--split east+central,west]
[--policies gpipe,atlas] [--iterations 3] [--repeat 1] [--json benchmarks/cluster-run.json]`:
the machines are namespaces on a bridge (testbed.emulator.net.namespace_cluster), by default one
per DC; the coordinator's
`testbed up --cluster` runs here and each other machine runs the torchrun command it
prints, as a user would. Emulated compute, the topology's job, dilation 1 for all runs
(the first iteration excluded). For each run: the median iteration, the time from the
network's first namespace to training's start (network, workers, rendezvous and joining),
and whether the run was bound by this machine (results.json's `emulation`).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from testbed.emulator.net.namespace_cluster import namespace_machines
from testbed.experiments.inputs import load_inputs
from testbed.experiments.run import run
from testbed.run.spec import RunSpec
from testbed.topology.cluster import load_cluster
from testbed.topology.seats import ClusterRun
from testbed.topology.secret_file import read_secret

ROOT = Path(__file__).resolve().parent.parent


class Watch:
    """The run's progress lines: when setup began and training started, and the other
    machines' commands started as printed."""

    def __init__(self) -> None:
        self.began: float | None = None
        self.training: float | None = None
        self.others: list[subprocess.Popen[bytes]] = []

    def __call__(self, line: str) -> None:
        print(line, flush=True)
        now = time.monotonic()
        if line.startswith("creating ") and self.began is None:
            self.began = now
        elif line.startswith("training:"):
            self.training = now
        elif line.startswith("  on m") and ": " in line:
            env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
            command = line.split(": ", 1)[1]
            self.others.append(subprocess.Popen(shlex.split(command), env=env,
                                                stdout=subprocess.DEVNULL,
                                                stderr=subprocess.DEVNULL))

    def finish(self) -> None:
        for process in self.others:
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()


def one_run(spec: RunSpec, directory: Path) -> dict[str, Any]:
    watch = Watch()
    try:
        results = run(spec, directory, watch).results
    finally:
        watch.finish()
    emulation = results.get("emulation") or {}
    return {"median_s": results["iteration_time_s"]["median"], "status": results["status"],
            "setup_s": (watch.training - watch.began) if watch.training and watch.began
            else None, "machine_bound": emulation.get("cpu_bound"),
            "emulation": emulation}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("topology", nargs="?", default=str(ROOT / "topologies" / "paper-3dc.yaml"))
    parser.add_argument("--split", help="machines' DCs: DC+DC,DC,... (default: one DC each)")
    parser.add_argument("--policies", default="gpipe,atlas")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    inputs = load_inputs(Path(args.topology), sets=(f"iterations={args.iterations}",))
    topology, job = inputs.topology, inputs.job
    rows: list[dict[str, Any]] = []
    groups = ([g.split("+") for g in args.split.split(",")] if args.split
              else [[dc.name] for dc in topology.datacenters])
    names = [f"m{i + 1}" for i in range(len(groups))]
    with namespace_machines(names) as machines, tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        secret = scratch / "secret"
        secret.write_text(secrets.token_hex(32))
        secret.chmod(0o600)
        path = scratch / "cluster.yaml"
        path.write_text(json.dumps({"secret": "secret", "machines": [
            {"name": m.name, "address": m.address, "netns": m.netns, "dcs": dcs}
            for m, dcs in zip(machines, groups, strict=True)]}))
        cluster = load_cluster(path, topology)
        across = ClusterRun(cluster, cluster.coordinator, read_secret(cluster))
        for policy in args.policies.split(","):
            row: dict[str, Any] = {"policy": policy}
            simulated = run(RunSpec.build("simulate", topology, job, policy=policy),
                            scratch / "sim")
            row["simulated_s"] = simulated.results["iteration_time_s"]["median"]
            for where, cluster_run in (("one_machine", None), ("across", across)):
                runs = [one_run(RunSpec.build("emulate", topology, job, policy=policy,
                                              compute="emulated", cluster=cluster_run),
                                scratch / f"{policy}-{where}-{k}")
                        for k in range(args.repeat)]
                medians = [r["median_s"] for r in runs if r["median_s"] is not None]
                row[where] = {"median_s": statistics.median(medians) if medians else None,
                              "runs": runs}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\n{topology.name} on {len(names)} machines "
          f"({', '.join('+'.join(g) for g in groups)}), {args.iterations} iterations, "
          "emulated compute, dilation 1\n")
    print("| policy | simulated | one machine | across machines | across / one | "
          "across / simulated | setup: one machine | across machines |\n"
          "|---|---|---|---|---|---|---|---|")
    for row in rows:
        one, many = row["one_machine"], row["across"]
        sim = row["simulated_s"]

        def seconds(value: float | None) -> str:
            return "failed" if value is None else f"{value:.3f} s"

        def ratio(a: float | None, b: float | None) -> str:
            return "" if a is None or not b else f"{a / b:.3f}"

        def setup(part: dict[str, Any]) -> str:
            times = [r["setup_s"] for r in part["runs"] if r["setup_s"] is not None]
            return f"{statistics.median(times):.1f} s" if times else ""

        def spread(part: dict[str, Any]) -> str:
            times = sorted(r["median_s"] for r in part["runs"] if r["median_s"] is not None)
            text = seconds(part["median_s"])
            return text if len(times) < 2 else f"{text} ({times[0]:.2f}-{times[-1]:.2f})"

        print(f"| {row['policy']} | {seconds(sim)} | {spread(one)} | {spread(many)} | "
              f"{ratio(many['median_s'], one['median_s'])} | "
              f"{ratio(many['median_s'], sim)} | {setup(one)} | {setup(many)} |")
    if args.json:
        args.json.write_text(json.dumps({"topology": topology.name, "machines": groups,
                                         "iterations": args.iterations, "rows": rows},
                                        indent=1))


if __name__ == "__main__":
    main()
