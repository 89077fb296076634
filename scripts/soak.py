#!/usr/bin/env python3
"""Soak test: does testbed keep working and leave nothing behind?

  1. N up/down cycles of the network (`net up --detach`, `down`): leftovers after each.
  2. M cycles of `up` killed with SIGKILL mid-training, then `testbed down`: leftovers.
  3. A long emulated run with a link flap every minute and 1% loss on every WAN link:
     iterations completed, results complete.
  4. Fuzzed input files through the CLI, per input kind: cases tried and failures.
  5. Faults a live run must survive or report (scripts/soak_faults.py), K cycles each:
     strangers dialling every worker, `down` racing `up`, a SIGKILLed delay line,
     SIGTERM to every worker: failures and leftovers.
  6. Probes of input past its bounds (scripts/soak_faults.py's bounds_probes): each
     refused in one line, or taken, within its time.

Run as root from the repository: `.venv/bin/python scripts/soak.py` (about 20 minutes;
`--quick` for a short pass); `--only bounds` needs no root. Writes a JSON summary with
--out.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
FAULTS = ("stray", "race", "delayline", "sigterm")
TESTBED = [sys.executable, "-c", "from testbed.cli.main import main; main()"]
STATE = Path("/run/testbed")


def leftovers() -> dict[str, int]:
    """Namespaces, recorded runs and processes of ours still on the machine."""
    from testbed.emulator.net.cleanup import stray_processes
    from testbed.emulator.net.netns import list_namespaces

    return {"namespaces": len([n for n in list_namespaces() if n.startswith("tb")]),
            "state": len(list(STATE.glob("[!.]*"))) if STATE.exists() else 0,
            "processes": len(stray_processes())}


def testbed(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*TESTBED, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def up_down(cycles: int, topology: Path) -> dict[str, Any]:
    times, bad = [], 0
    for i in range(cycles):
        started = time.monotonic()
        result = testbed("net", "up", str(topology), "--detach")
        if result.returncode != 0:
            raise SystemExit(f"net up failed: {result.stderr.strip()}")
        testbed("down")
        times.append(time.monotonic() - started)
        left = leftovers()
        bad += any(left.values())
        print(f"up/down {i + 1}/{cycles}: {times[-1]:.2f} s, leftovers {left}", flush=True)
    return {"cycles": cycles, "with_leftovers": bad, "seconds_per_cycle": _stats(times)}


def kill_down(cycles: int, topology: Path) -> dict[str, Any]:
    times, bad = [], 0
    for i in range(cycles):
        started = time.monotonic()
        proc = subprocess.Popen([*TESTBED, "up", str(topology), "-p", "gpipe", "--compute",
                                 "emulated", "--iterations", "10000", "--out",
                                 f"/tmp/testbed-soak-kill-{os.getpid()}"],
                                stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                cwd=ROOT)
        assert proc.stderr is not None
        for line in proc.stderr:
            if line.startswith("iteration 2/"):
                break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        result = testbed("down")
        times.append(time.monotonic() - started)
        left = leftovers()
        bad += any(left.values())
        print(f"SIGKILL + down {i + 1}/{cycles}: {times[-1]:.2f} s, "
              f"{result.stdout.strip() or result.stderr.strip()}; leftovers {left}", flush=True)
    return {"cycles": cycles, "with_leftovers": bad, "seconds_per_cycle": _stats(times)}


def flapping_run(minutes: float, topology: Path, policy: str, out: Path,
                 congestion: str) -> dict[str, Any]:
    """An emulated run of about `minutes`, a WAN link down for 5 s every minute (links in
    turn) and 1% loss on every WAN link throughout, with `congestion` control (with cubic,
    1% loss holds a flow on a 40-90 ms path to a few Mbit/s, and an iteration to hours)."""
    from testbed.common.yamlio import to_yaml
    from testbed.topology import dump_topology, load_topology

    data = dump_topology(load_topology(topology))
    data.setdefault("tcp", {})["congestion"] = congestion
    topology = out / f"{data.get('name', 'topology')}-{congestion}.yaml"
    topology.write_text(to_yaml(data))
    topo = load_topology(topology)
    sim = testbed("simulate", str(topology), "-p", policy, "--iterations", "3", "--out",
                  str(out / "estimate"))
    if sim.returncode != 0:
        raise SystemExit(f"simulate failed: {sim.stderr.strip()}")
    estimate = json.loads((out / "estimate" / "results.json").read_text())
    per_iteration = estimate["iteration_time_s"]["median"]
    iterations = max(3, int(minutes * 60 / per_iteration))
    links = [f"{link.a}-{link.b}" for link in topo.links]
    events = [f"at=0s,link={link},loss=1%" for link in links]
    events += [f"at={60 * k - 30}s,link={links[k % len(links)]},down=5s"
               for k in range(1, int(minutes) + 1)]
    args = ["up", str(topology), "-p", policy, "--compute", "emulated", "--iterations",
            str(iterations), "--stall-timeout", "120", "--out", str(out / "flap")]
    for event in events:
        args += ["--event", event]
    print(f"flapping run: {iterations} iterations of about {per_iteration:.1f} s, "
          f"{len(events)} events", flush=True)
    started = time.monotonic()
    result = testbed(*args, timeout=minutes * 60 * 4 + 600)
    wall = time.monotonic() - started
    results = json.loads((out / "flap" / "results.json").read_text())
    files = sorted(p.name for p in (out / "flap").iterdir())
    return {"exit": result.returncode, "congestion": congestion, "wall_s": round(wall, 1),
            "iterations": iterations,
            "completed": results["iterations"], "status": results["status"],
            "iteration_s": results["iteration_time_s"], "events": len(results["events"]),
            "files": files, "leftovers": leftovers(),
            "error": results.get("error")}


def fuzz(cases: int) -> dict[str, Any]:
    """Each fuzz test of tests/test_fuzz.py with `cases` examples; failures per kind."""
    from hypothesis import HealthCheck, settings

    settings.register_profile("soak", max_examples=cases, deadline=None, database=None,
                              suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("soak")
    import tests.test_fuzz as fuzzing  # after the profile: the plotting test scales with it

    out: dict[str, Any] = {}
    for name in ("topology_data", "topology_text", "job_file", "plan_csv", "results_files",
                 "results_files_that_pass_the_checks_still_plot"):
        test = getattr(fuzzing, f"test_fuzzed_{name}")
        count = cases if "plot" not in name else max(10, cases // 13)  # as the test says
        started = time.monotonic()
        try:
            test()
            failures = 0
        except Exception as exc:  # a counterexample: report it, go on with the rest
            import traceback

            traceback.print_exc()
            print(f"fuzz {name}: FAILED: {exc}", flush=True)
            failures = 1
        out[name] = {"cases": count, "failures": failures,
                     "seconds": round(time.monotonic() - started, 1)}
        print(f"fuzz {name}: {out[name]}", flush=True)
    return out


def _stats(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"median": round(ordered[len(ordered) // 2], 3), "max": round(ordered[-1], 3),
            "min": round(ordered[0], 3)} if ordered else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="5 up/down, 2 kills, a 2-minute run, 200 fuzz cases per kind")
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--fuzz", type=int, default=2000, help="fuzz cases per input kind")
    parser.add_argument("--faults", type=int, default=20, help="cycles of each fault case")
    parser.add_argument("--only", choices=["updown", "kill", "flap", "fuzz", *FAULTS,
                                           "bounds"], action="append")
    parser.add_argument("--topology", type=Path, default=ROOT / "topologies" / "two-dc.yaml")
    parser.add_argument("--flap-topology", type=Path,
                        default=ROOT / "topologies" / "paper-3dc.yaml")
    parser.add_argument("--policy", default="gpipe",
                        help="policy of the flapping run (its emulation must keep pace)")
    parser.add_argument("--congestion", default="bbr",
                        help="TCP congestion control of the flapping run")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "soak")
    args = parser.parse_args()
    if args.quick:
        args.cycles, args.kills, args.minutes, args.fuzz, args.faults = 5, 2, 2.0, 200, 2
    parts = args.only or ["updown", "kill", "flap", "fuzz", *FAULTS, "bounds"]
    if os.geteuid() != 0 and set(parts) != {"bounds"}:
        raise SystemExit("soak: needs root (network namespaces), but for --only bounds")
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "soak.json"  # parts run again replace their entries
    report: dict[str, Any] = json.loads(saved.read_text()) if saved.exists() else {}
    if set(parts) != {"bounds"}:  # the probes make no namespace, process or run state
        report["leftovers_before"] = leftovers()
    if "updown" in parts:
        report["up_down"] = up_down(args.cycles, args.topology)
    if "kill" in parts:
        report["sigkill_down"] = kill_down(args.kills, args.topology)
    if "flap" in parts:
        report["flapping_run"] = flapping_run(args.minutes, args.flap_topology, args.policy,
                                              args.out, args.congestion)
    if "fuzz" in parts:
        report["fuzz"] = fuzz(args.fuzz)
    import soak_faults

    if "bounds" in parts:
        report["bounds"] = soak_faults.run_probes(soak_faults.bounds_probes(),
                                                  args.out / "bounds")

    cases = {"stray": soak_faults.stray_connections, "race": soak_faults.down_racing_up,
             "delayline": soak_faults.killed_delay_line, "sigterm": soak_faults.sigterm_workers}
    for name in FAULTS:
        if name in parts:
            report[name] = cases[name](args.faults, args.topology, args.out, leftovers)
    saved.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
