"""The rank order of a launch: the GPU hosts in the topology file's order, the GPUs a
policy's plan uses (`-p atlas`: the DCs and stages Atlas picks, replica by replica, stage
by stage, so rank r runs what stage r of replica 0 would), or a file's list."""

from __future__ import annotations

from pathlib import Path

from testbed.common.yamlio import read_yaml
from testbed.errors import InputError
from testbed.job.model import Job
from testbed.policy.registry import Planner
from testbed.topology.model import Topology

FILE_ORDER = "file"


def file_order(topology: Topology) -> list[str]:
    """Every GPU host, DCs as the file lists them."""
    return [gpu.name for gpu in topology.gpus()]


def policy_order(topology: Topology, job: Job, policy: str, options: dict[str, str],
                 planner: Planner) -> list[str]:
    """The GPUs the policy's plan for this job uses, replica-major, stage by stage;
    `planner`: what makes the plan (the caller's, with the simulator)."""
    from testbed.policy import training_policy

    plan = planner(training_policy(policy, options), topology, job)
    if plan.tp != 1:
        raise InputError(f"the plan of {policy} has tp {plan.tp}; a launch starts one rank "
                         "per GPU host and places whole stages", "-p")
    return plan.used_gpus()


def order_from_file(path: Path, topology: Topology) -> list[str]:
    """A YAML list of GPU hosts, rank 0 first (`[west-0, east-0]`, or one per line as
    `- west-0`); each a host of the topology, none twice."""
    source = str(path)
    hosts = read_yaml(path)
    if not isinstance(hosts, list) or not hosts:
        raise InputError("expected a list of GPU hosts in rank order (e.g. [east-0, west-0])",
                         source)
    seen: set[str] = set()
    for i, host in enumerate(hosts):
        if not isinstance(host, str):
            raise InputError(f"expected a GPU host like east-0, got {host!r}", source, f"[{i}]")
        try:
            topology.gpu(host)
        except (KeyError, ValueError):
            raise InputError(f"no GPU host {host!r} in topology {topology.name!r}", source,
                             f"[{i}]") from None
        if host in seen:
            raise InputError(f"{host} is listed twice", source, f"[{i}]")
        seen.add(host)
    return list(hosts)


def rank_order(topology: Topology, job: Job, placement: str, options: dict[str, str],
               planner: Planner) -> list[str]:
    """`placement`: `file`, a policy's name, or a path to a file of hosts (it has a `/` or
    ends in .yaml/.yml/.txt)."""
    if placement == FILE_ORDER:
        return file_order(topology)
    if "/" in placement or placement.endswith((".yaml", ".yml", ".txt")):
        return order_from_file(Path(placement), topology)
    return policy_order(topology, job, placement, options, planner)
