"""`testbed net ...` and `testbed down`: the emulated WAN on its own, Mininet style."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import click

from testbed.common.choices import ShaperChoice, values_of
from testbed.common.units import human_rate
from testbed.emulator.net.interrupts import critical, stop_point, stop_signals
from testbed.emulator.net.layout import check_limits
from testbed.emulator.net.state import NetInfo, RunState, all_states
from testbed.errors import NetworkError, Terminated, TestbedError
from testbed.topology import Topology, load_topology
from testbed.topology.cluster import Cluster, load_cluster, machine_at

SHAPERS = values_of(ShaperChoice)
machine_option = click.option(
    "--machine", help="Which machine of --cluster this is (default: the one whose address "
    "is on this machine).")


def require_root() -> None:
    if os.geteuid() != 0:
        raise TestbedError("the emulated network needs root (network namespaces, tc)")


def echo_err(message: str) -> None:
    click.echo(message, err=True)


@click.group()
def net() -> None:
    """The emulated WAN alone: bring it up, list it, run commands in it, measure it."""


shaper_option = click.option(
    "--shaper",
    type=click.Choice(SHAPERS),
    default="auto",
    show_default=True,
    help="How links get delay and loss: netem where the kernel has it (auto), or the "
    "userspace delay line.",
)


@net.command("up")
@click.argument(
    "topology", metavar="TOPOLOGY.yaml", type=click.Path(dir_okay=False, path_type=Path)
)
@shaper_option
@click.option(
    "--detach", is_flag=True, help="Return once the network is ready; `testbed down` removes it."
)
@click.option("--cluster", "cluster_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Cluster file: the machines one network spans and the DCs each carries; "
              "bring up this machine's share (WAN links to other machines' DCs become "
              "VXLAN tunnels over the cluster network).")
@machine_option
def net_up(topology: Path, shaper: str, detach: bool, cluster_file: Path | None,
           machine: str | None) -> None:
    """Bring up the topology's network and keep it until Ctrl-C (or --detach).

    Each GPU host is a namespace named like the host (east-0, west-1, ...; a second
    concurrent network gets a tb<k>- prefix); host names resolve in every namespace, so
    `testbed net exec east-0 -- ping west-0` works. With --cluster, run it on each
    machine of the cluster: each brings up its own DCs, and together they make one network.
    """
    from testbed.emulator.net.network import bring_up
    from testbed.emulator.net.teardown import clean_own_states

    topo = load_topology(topology)
    check_limits(topo)
    cluster, machine = this_machine(cluster_file, machine, topo)
    require_root()
    with stop_signals():
        try:
            network = bring_up(topo, shaper, progress=echo_err, detached=detach,
                               cluster=cluster, machine=machine)
            stop_point()  # one that came as bring-up ended: the network goes again
            if detach:
                click.echo(
                    f"network {network.state.run_id} is up (shaper {network.shaper.value});"
                    " `testbed net ls` shows it, `testbed down` removes it"
                )
                return
            _print_listing(network.describe())
            echo_err("network is up; Ctrl-C tears it down")
            while True:
                signal.pause()
        except (KeyboardInterrupt, Terminated) as exc:
            echo_err("tearing down")
            with critical():
                for problem in clean_own_states():
                    echo_err(f"teardown: {problem}")
            sys.exit(143 if isinstance(exc, Terminated) else 130)


def _pick_state(run_id: str | None) -> RunState:
    states = [s for s in all_states() if s.ready]
    if run_id is not None:
        states = [s for s in states if s.run_id == run_id]
    if not states:
        raise NetworkError(
            "no network is up"
            + (f" with id {run_id}" if run_id else "")
            + "; start one with `testbed net up TOPOLOGY`"
        )
    if len(states) > 1:
        ids = ", ".join(s.run_id for s in states)
        raise NetworkError(f"several networks are up ({ids}); choose one with --run")
    return states[0]


def _print_listing(info: NetInfo) -> None:
    click.echo(f"network {info['run_id']}: topology {info['topology']}, shaper {info['shaper']}")
    click.echo(f"{'node':<14} {'dc':<12} {'address':<14} netns")
    for node in info["nodes"]:
        click.echo(f"{node['name']:<14} {node['dc']:<12} {node['address']:<14} {node['netns']}")
    for link in info["links"]:
        a, b = link["between"]
        click.echo(
            f"link {a} <-> {b}: {link['latency_ms']:g} ms one way, "
            f"{human_rate(link['bandwidth_bps'])}, queue {link['queue_bytes']} B, "
            f"{link['shaper']}"
        )
    for note in info.get("notes", []):
        click.echo(f"note: {note}")
    cluster = info.get("cluster")
    if cluster:
        click.echo(f"cluster {cluster['name']}: this is {cluster['machine']}; "
                   f"coordinator {cluster['coordinator']}, MTU {cluster['mtu']}")
        for machine in cluster["machines"]:
            here = " (here)" if machine["name"] == cluster["machine"] else ""
            click.echo(f"  machine {machine['name']}{here} at {machine['address']}: "
                       f"{', '.join(machine['dcs'])}")
        for tunnel in cluster["tunnels"]:
            click.echo(f"  tunnel {tunnel['dc']} -> {tunnel['peer']}: VXLAN {tunnel['vni']} "
                       f"to {tunnel['remote']}")


@net.command("ls")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--run", "run_id", help="Which network, when several are up.")
def net_ls(as_json: bool, run_id: str | None) -> None:
    """List the running network's nodes, addresses, namespaces and links."""
    states = [s for s in all_states() if s.ready and (run_id is None or s.run_id == run_id)]
    if as_json:
        infos = [s.info for s in states]
        click.echo(json.dumps(infos[0] if len(infos) == 1 else {"networks": infos}, indent=1))
        return
    if not states:
        click.echo("no network is up")
        return
    for state in states:
        _print_listing(state.info)


@net.command("exec", context_settings={"ignore_unknown_options": True})
@click.argument("node")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.option("--run", "run_id", help="Which network, when several are up.")
def net_exec(node: str, command: tuple[str, ...], run_id: str | None) -> None:
    """Run COMMAND inside NODE's namespace: `testbed net exec east-0 -- iperf3 -s`."""
    require_root()
    state = _pick_state(run_id)
    nodes = {n["name"]: n for n in state.info.get("nodes", [])}
    routers = {f"r-{r['dc']}": r for r in state.info.get("routers", [])}
    target = nodes.get(node) or routers.get(node)
    if target is None:
        known = ", ".join(list(nodes) + list(routers))
        raise click.BadParameter(f"no node {node!r} (nodes: {known})", param_hint="NODE")
    args = ["ip", "netns", "exec", target["netns"], *command]
    sys.stdout.flush()
    try:
        os.execvp("ip", args)
    except OSError as exc:
        raise TestbedError(f"cannot run ip netns exec: {exc}") from None


@net.command("check")
@click.argument(
    "topology", metavar="TOPOLOGY.yaml", type=click.Path(dir_okay=False, path_type=Path)
)
@shaper_option
@click.option(
    "--seconds",
    type=float,
    default=5.0,
    show_default=True,
    help="Length of each throughput measurement.",
)
@click.option(
    "--flows",
    type=int,
    default=8,
    show_default=True,
    help="Parallel flows for the many-flow measurement.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def net_check(topology: Path, shaper: str, seconds: float, flows: int, as_json: bool) -> None:
    """Bring the network up, measure every WAN link, print measured vs configured, tear down.

    For each link: RTT (median and minimum, against the configured RTT), one TCP flow (a
    long link caps it at window/RTT), and several parallel flows (which should fill it).
    """
    from testbed.emulator.net.check import check_link
    from testbed.emulator.net.network import bring_up
    from testbed.emulator.net.teardown import clean_own_states

    require_root()
    topo = load_topology(topology)
    check_limits(topo)
    results = []
    with stop_signals():
        try:
            network = bring_up(topo, shaper, progress=echo_err)
            for link in topo.links:
                echo_err(f"measuring {link.a} <-> {link.b}")
                results.append(check_link(network, link.a, link.b, seconds, flows))
            cpu = network.delay_line_stats()
        finally:
            with critical():
                for problem in clean_own_states():
                    echo_err(f"teardown: {problem}")
    if as_json:
        click.echo(
            json.dumps(
                {
                    "shaper": network.shaper.value,
                    "links": [r.as_dict() for r in results],
                    "delay_lines": cpu,
                },
                indent=1,
            )
        )
        return
    click.echo(f"shaper {network.shaper.value}")
    click.echo(
        f"{'link':<20} {'RTT cfg':>9} {'median':>9} {'min':>9} {'rate':>10} "
        f"{'1 flow':>10} {'limit':>10} {f'{flows} flows':>10} {'of rate':>8}"
    )
    for r in results:
        click.echo(
            f"{r.a + '<->' + r.b:<20} {r.rtt_configured_s * 1e3:>7.2f}ms "
            f"{r.rtt_median_s * 1e3:>7.2f}ms {r.rtt_min_s * 1e3:>7.2f}ms "
            f"{human_rate(r.rate_configured_bps):>10} {human_rate(r.one_flow_bps):>10} "
            f"{human_rate(min(r.window_limit_bps, r.rate_configured_bps)):>10} "
            f"{human_rate(r.many_flows_bps):>10} "
            f"{r.many_flows_bps / r.rate_configured_bps:>7.0%}"
        )


@click.command()
@click.argument("run", required=False)
@click.option("--all", "stop_live", is_flag=True,
              help="Also stop runs that are still alive (asked to stop, then removed).")
def down(run: str | None, stop_live: bool) -> None:
    """Remove what runs of testbed left behind: namespaces, delay lines, workers.

    Also what killed sweeps left: their workers, a local Ray instance's processes and
    folder; and the results directories killed commands had made and left empty. Safe to
    run at any time; it touches only what testbed recorded, marked or named as its own,
    and leaves runs and sweeps that are still alive alone. RUN (a run id, see `testbed net
    ls`) removes that run only, stopping it if it is alive; --all stops live runs too.
    """
    from testbed.emulator.net.cleanup import down as clean

    require_root()
    report = clean(echo_err, run=run, stop_live=stop_live)
    for problem in report.problems:
        echo_err(f"down: {problem}")
    for line in report.summary():
        click.echo(line)
    if any("still present" in p or p.startswith("no run ") for p in report.problems):
        sys.exit(1)


def this_machine(path: Path | None, machine: str | None, topology: Topology
                 ) -> tuple[Cluster | None, str | None]:
    """--cluster's file and which of its machines this is (`--machine`, else the one
    whose address is here); an unknown name fails here, before anything is made."""
    if path is None:
        if machine is not None:
            raise click.UsageError("--machine needs --cluster")
        return None, None
    from testbed.emulator.net.netns import local_addresses

    cluster = load_cluster(path, topology)
    machine = machine or machine_at(cluster, local_addresses())
    cluster.machine(machine)
    return cluster, machine
