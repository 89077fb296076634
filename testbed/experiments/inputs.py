"""A topology file and its job, with every override applied: what a command or a script
runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.job.load import load_job
from testbed.job.model import Job
from testbed.scenario.scenario import Scenario, load_scenario
from testbed.topology import Topology, load_topology
from testbed.topology.net_events import NetEvent, parse_event_flag, parse_events
from testbed.topology.overrides import is_topology_key, override

JOB_FLAGS = ("iterations", "microbatches", "dp", "pp", "seed")
"""Job values that have a flag of their own (`--iterations 3` is `--set iterations=3`)."""


@dataclass(frozen=True)
class Inputs:
    topology: Topology
    job: Job
    events: tuple[NetEvent, ...] = ()
    """The topology's, then the scenario's, then `--event`'s."""
    scenario: Scenario = field(default_factory=Scenario)
    """Link traces, stragglers and failures (`--scenario FILE`)."""


def load_inputs(
    topology_path: Path,
    job_file: Path | None = None,
    sets: tuple[str, ...] = (),
    events: tuple[str, ...] = (),
    scenario: Path | None = None,
    **flags: Any,
) -> Inputs:
    """Topology and job with every override applied, and the scenario's file read against
    them, or a located InputError. `sets`: `KEY=VALUE` as `--set` gives them, a topology key
    (testbed.topology.overrides) or a job key."""
    topology = load_topology(topology_path)
    job_sets = []
    for item in sets:
        key, sep, value = item.partition("=")
        if sep and is_topology_key(key.strip()):
            topology = override(topology, key.strip(), value)
        else:
            job_sets.append(item)
    given = [f"{key}={flags[key]}" for key in JOB_FLAGS if flags.get(key) is not None]
    job = load_job(topology.job, topology.source, job_file, job_sets, given)
    parsed = parse_events(list(topology.events or ()), topology, topology.source)
    happening = Scenario()
    if scenario is not None:
        happening, more = load_scenario(scenario, topology)
        parsed += more
    parsed += tuple(parse_event_flag(text, topology) for text in events)
    return Inputs(topology, job, parsed, happening)
