"""`testbed launch`: your own training program, unmodified, over the emulated WAN."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click

from testbed.cli.net import SHAPERS, machine_option, require_root, this_machine
from testbed.cli.options import (
    event_options,
    force_option,
    job_flags,
    job_options,
    policy_options,
    results_dir,
    run_verbosity_option,
    target_loss_option,
)
from testbed.cli.progress import Reporter
from testbed.common.choices import ShaperChoice
from testbed.emulator.runtime.launch.placement import FILE_ORDER, rank_order
from testbed.emulator.runtime.launch.ranks import MASTER_PORT
from testbed.emulator.runtime.launch.spec import DEFAULT_GRACE_S, LaunchSpec, refuse_dilation
from testbed.experiments.inputs import load_inputs
from testbed.experiments.planning import plan_with_simulator
from testbed.policy import parse_options
from testbed.report.launch_results import launch_summary
from testbed.report.results import new_run_dir
from testbed.topology.secret_file import read_secret

EXIT = {"ok": 0, "failed": 1, "timed_out": 1}


@click.command()
@click.argument("topology", metavar="TOPOLOGY.yaml",
                type=click.Path(dir_okay=False, path_type=Path))
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("-p", "--placement", default=FILE_ORDER, show_default=True,
              metavar="file|POLICY|FILE",
              help="Rank order: the topology file's GPU hosts in order (file); the GPUs a "
              "policy's plan uses, replica by replica, stage by stage (-p atlas places ranks "
              "as Atlas places stages; the job's pp and dp shape it); or a YAML list of "
              "hosts in a file.")
@policy_options
@job_options
@click.option("--per", type=click.Choice(["host", "dc"]), default="host", show_default=True,
              help="One process per GPU host (RANK, WORLD_SIZE, ...), or one per DC in its "
              "first host's namespace, for torchrun's own --nproc-per-node (its arguments "
              "as PET_* variables).")
@click.option("--torchrun", is_flag=True,
              help="Start a torchrun per host around COMMAND, a c10d rendezvous at rank 0's "
              "host (torch numbers the ranks; results say which each got).")
@click.option("--max-restarts", type=click.IntRange(min=0), default=0, show_default=True,
              help="torchrun's --max-restarts (with --torchrun).")
@click.option("--master-port", type=click.IntRange(1, 65535), default=MASTER_PORT,
              show_default=True, help="MASTER_PORT.")
@click.option("--timeout", "timeout_s", type=float, metavar="SECONDS",
              help="Stop every rank after this many seconds (a hung program).")
@click.option("--grace", "grace_s", type=click.FloatRange(min=0), default=DEFAULT_GRACE_S,
              show_default=True,
              help="After a rank fails, the seconds the others get to end by themselves.")
@click.option("--dilation", default="1", show_default=True, metavar="1",
              help="Refused above 1: a dilated network with undilated compute is another "
              "experiment (see docs/launch.md).")
@click.option("--shaper", type=click.Choice(SHAPERS), default="auto", show_default=True,
              help="netem where the kernel has it, else the userspace delay line.")
@click.option("--sample", "sample_s", type=click.FloatRange(min=0.05), default=0.2,
              show_default=True, help="Seconds between two reads of the WAN's counters.")
@event_options
@click.option("--scenario", "scenario", type=click.Path(dir_okay=False, path_type=Path),
              metavar="FILE", help="Scenario file (YAML): network events, link traces and "
              "failures (a lost host: its rank's processes killed at that time), times from "
              "the ranks' start (see docs/scenarios.md).")
@target_loss_option
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              help="Results directory (default: a new one under runs/).")
@force_option
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Launch across the machines of this cluster file: run the same command "
              "on each; each brings up its share of the network (VXLAN to the others), "
              "joins the coordinator (proving the file's secret), and once all have joined "
              "starts the ranks of its own DCs (MASTER_ADDR rank 0's wherever it is); each "
              "keeps its share up until every machine's ranks have ended and writes its "
              "own results (its ranks, the WAN directions its routers send).")
@machine_option
@click.option("--join-timeout", type=click.FloatRange(min=1), default=300.0,
              show_default=True, help="Seconds the coordinator waits for the other "
              "machines to run the same command (--cluster).")
@run_verbosity_option
def launch(topology: Path, command: tuple[str, ...], placement: str,
           policy_opts: tuple[str, ...], per: str, torchrun: bool, max_restarts: int,
           master_port: int, timeout_s: float | None, grace_s: float, dilation: str,
           shaper: ShaperChoice, sample_s: float, target_loss: float | None,
           out: Path | None, force: bool, cluster_file: Path | None, machine: str | None,
           join_timeout: float, reporter: Reporter, **kwargs: Any) -> None:
    """Run your own program over the emulated WAN: `testbed launch TOPO -- python train.py`.

    Brings the topology's network up, starts COMMAND once per GPU host inside its
    namespace with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR (rank 0's
    address in the emulated network), MASTER_PORT, TESTBED_DC and TESTBED_GPU set, and
    measures each WAN link direction (the shaper's counters) and each rank (exit code,
    CPU, memory, wall time) while it runs. Each rank's output goes to its own log and, with
    its rank before each line, to the console. A line `TESTBED_METRIC {"step": 3, "loss":
    2.3}` (or the JSON alone in the file $TESTBED_METRICS names) reports the program's own
    metrics. Writes results.json, trace.json.gz, wan.png (and loss.png) into the results
    directory. Compute runs at this machine's speed, the network in real time.
    """
    require_root()
    refuse_dilation(dilation)
    flags = job_flags(kwargs)
    inputs = load_inputs(topology, **flags)
    cluster, machine = this_machine(cluster_file, machine, inputs.topology)
    secret = read_secret(cluster) if cluster is not None else b""
    hosts = rank_order(inputs.topology, inputs.job, placement,
                       dict(parse_options(policy_opts)), plan_with_simulator)
    directory = results_dir(out, force, lambda: new_run_dir(inputs.topology.name, "launch"))
    spec = LaunchSpec(inputs.topology, command, tuple(hosts), placement, directory,
                      per, torchrun, max_restarts, master_port,  # type: ignore[arg-type]
                      shaper, timeout_s, grace_s, inputs.events, inputs.scenario, target_loss,
                      sample_s, cluster, machine, secret, join_timeout)
    spec.check()
    reporter.say(f"launch: {' '.join(command)} on {inputs.topology.name}, ranks on "
                 f"{', '.join(hosts)}")
    from testbed.emulator.runtime.launch.launcher import Launcher
    from testbed.emulator.runtime.launch.outcome import write_launch

    quiet = reporter.verbosity == "quiet"
    launcher = Launcher(spec, reporter.say, (lambda _l: None) if quiet else
                        lambda line: click.echo(line), reporter.verbosity == "verbose")
    run = asyncio.run(launcher.launch())
    results = write_launch(run)
    for line in launch_summary(results)[:-1]:
        click.echo(line)
    click.echo(f"results in {directory}")
    if results.status != "ok":
        click.echo(f"testbed: error: {results.error}", err=True)
        sys.exit(130 if run.signal == 2 else 143 if run.signal else EXIT[results.status])

