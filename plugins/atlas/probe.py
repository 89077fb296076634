"""The job Atlas's search simulates its candidates with: the same for runs that differ
only in what the candidates' runs do not measure, so that they share one search (within a
command, and across commands: the planning store's key names it). Pure."""

from __future__ import annotations

from dataclasses import replace

from testbed.policy.api import Job, Topology

LARGE = 256
"""GPUs above which candidates are simulated for two iterations only (a warm-up and one
measured): the first alone starts with cold windows and ranks plans by their start."""
PROBE_ITERATIONS = 3
"""Enough for the staggered rhythm of temporal sharing to settle after the first."""


def searched_job(topology: Topology, job: Job) -> Job:
    """The job as Atlas's search simulates it: a few iterations (PROBE_ITERATIONS, or two
    above LARGE GPUs) of training alone, since the candidates' runs fill no bubbles (an
    inference workload changes nothing they measure)."""
    return replace(job, inference=None, iterations=min(
        job.iterations, PROBE_ITERATIONS if topology.total_gpus <= LARGE else 2))
