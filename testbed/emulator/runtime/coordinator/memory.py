"""An emulated run's memory on this machine: predicted from its plan before anything
starts, refused (with how to fit) when it exceeds what the machine has, and measured.

The prediction is the sum of
- the workers, one per GPU: one resident set each (the interpreter and our modules; with
  real compute torch and its stages' training state, fp32 weights, gradients and AdamW's
  two moments);
- payloads in flight: real compute keeps what it receives until its stage reads it and
  torch keeps every in-flight microbatch's activations for the backward, over all the
  stages a GPU holds at its worst moment (testbed.plan.activations; per layer
  s·b·h·(34 + 5·a·s/h) bytes at 16 bits, Korthikanti et al. 2022, doubled for fp32);
  emulated compute keeps sizes, not payloads (testbed.emulator.runtime.worker.transport.transport),
  so nothing;
- the WAN's packets in flight: per link direction its rate times its one-way delay and
  jitter, plus its drop-tail queue (held by the delay lines or by netem);
- the workers' TCP connections, each a socket at both ends (the plan's connections per
  pair: a plan given with a hundred million of them grew a worker to 1.66 GB);
- the coordinator: this process as it is now, plus every span the run reports, kept until
  the results are written.
Pure, apart from `coordinator_now`, which reads /proc (what the machine has available is
testbed.plan.host_limits.available_memory).
"""

from __future__ import annotations

import dataclasses
import math
import os
import resource
from collections.abc import Mapping
from dataclasses import dataclass

from testbed.common.choices import EmulatedCompute
from testbed.common.units import human_bytes, plural
from testbed.emulator.runtime.coordinator.exits import resident_bytes
from testbed.errors import InputError
from testbed.job.model import Job
from testbed.plan.activations import peak_layers_held
from testbed.plan.compute import stage_params
from testbed.plan.model import Plan
from testbed.topology.model import Topology

WORKER_BYTES: dict[EmulatedCompute, int] = {"emulated": 48 * 2**20, "real": 450 * 2**20}
"""Resident memory of one worker before payloads and model state (measured: 35-41 MB
emulated, 330 MB with torch and a tiny model), with a margin."""
TRAINING_BYTES_PER_PARAM = 16
"""Real compute trains in fp32 with AdamW: weights, gradients and two moments."""
SPAN_BYTES = 2048
"""One span in the coordinator, as received and again as written out (measured: about
630 bytes as a dict; dilated runs keep a represented copy too)."""
SPANS_PER_ACTION = 2
"""Spans a worker reports per action of its program (a receive is a `recv` and a
`transfer`, a send a `send` and often a wait)."""
DELAY_LINE_BYTES = 16 * 2**20
"""Resident memory of one delay-line process besides the packets it holds."""
CONNECTION_BYTES = 16 * 2**10
"""One data connection, both of its ends: measured 4.0 KB of a worker's resident memory
per socket (two transports over loopback with 2,000 and 6,000 connections, a one-off
measurement), and the kernel's socket, file and inode about as much again."""


@dataclass(frozen=True)
class MemoryPlan:
    """What an emulated run is predicted to hold at its peak, in bytes, by part."""

    compute: EmulatedCompute
    workers: int
    per_worker: int
    payloads: int
    """Payload buffers in flight, all workers together."""
    payload_per_microbatch: int
    """What one more microbatch in flight on every stage adds to `payloads`."""
    network: int
    """The WAN's packets in flight, and the delay-line processes."""
    coordinator: int
    span_bytes_per_iteration: int
    """What each iteration adds to the coordinator."""
    iterations: int
    connections: int = 0
    """The workers' data connections, all pairs together."""

    @property
    def total(self) -> int:
        return self.workers * self.per_worker + self.payloads + self.network \
            + self.coordinator + self.connection_bytes

    @property
    def connection_bytes(self) -> int:
        return self.connections * CONNECTION_BYTES

    def parts(self) -> str:
        return (f"workers {human_bytes(self.workers * self.per_worker)}, payloads in flight "
                f"{human_bytes(self.payloads)}, WAN in flight {human_bytes(self.network)}, "
                f"coordinator {human_bytes(self.coordinator)}, "
                f"{plural(self.connections, 'connection')} {human_bytes(self.connection_bytes)}")


def predict_memory(topology: Topology, job: Job, plan: Plan, compute: EmulatedCompute,
                   coordinator_now: int, delay_lines: bool = True) -> MemoryPlan:
    """The run's peak memory on this machine (see the module's docstring)."""
    per_worker = per_microbatch = 0
    gpus = plan.used_gpus()  # a worker per GPU, whatever stages it holds
    workers = len(gpus)
    payloads = 0
    model = job.model
    if compute == "real":
        layer = job.activation_bytes * (34 + 5 * model.heads * model.seq_len / model.hidden)
        state = sum(stage_params(model, plan.layers[stage], stage == 0, stage == plan.pp - 1)
                    for (_replica, stage), _ in plan.workers()) * TRAINING_BYTES_PER_PARAM
        for gpu in gpus:
            # received in fp32 (twice the job's 16 bits), and torch's saved activations
            one = {stage: 2 * job.activation_bytes + int(plan.layers[stage] * layer)
                   for stage in plan.stages_of(gpu)}
            payloads += max(peak_layers_held(program[gpu], one)
                            for program in plan.all_programs())
            per_microbatch += sum(one.values())
        per_worker = WORKER_BYTES["real"] + state // max(1, workers)
    else:
        per_worker = WORKER_BYTES["emulated"]
    actions = max(sum(len(program[gpu]) for gpu in gpus) for program in plan.all_programs())
    spans = actions * SPANS_PER_ACTION * SPAN_BYTES
    network = 0
    for link in topology.links:
        held = link.bandwidth_bps / 8 * (link.latency_s + link.jitter_s) \
            + link.effective_queue_bytes
        network += 2 * int(held) + (2 * DELAY_LINE_BYTES if delay_lines else 0)
    return MemoryPlan(compute, workers, per_worker, payloads, per_microbatch, network,
                      coordinator_now + spans * job.iterations, spans, job.iterations,
                      sum(plan.connections.values()))


def check_memory(memory: MemoryPlan, available: int | None, source: str | None) -> None:
    """Refuse, in one line with how to fit, a run predicted to need more memory than this
    machine has available."""
    if available is None or memory.total <= available:
        return
    raise InputError(
        f"{plural(memory.workers, 'worker')} with {memory.compute} compute need about "
        f"{human_bytes(memory.total)} of memory ({memory.parts()}); this machine has "
        f"{human_bytes(available)} available (MemAvailable){how_to_fit(memory, available)}",
        source, "datacenters")


def how_to_fit(memory: MemoryPlan, available: int) -> str:
    """The changes that would make the run fit, each on its own: emulated compute, fewer
    microbatches in flight, fewer iterations (the coordinator keeps every span)."""
    ways = []
    if memory.compute == "real":
        emulated = dataclasses.replace(memory, compute="emulated", payloads=0,
                                       payload_per_microbatch=0,
                                       per_worker=WORKER_BYTES["emulated"])
        if emulated.total <= available:
            ways.append("--compute emulated")
    over = memory.total - available
    if memory.payload_per_microbatch and memory.payloads > over:
        fewer = math.ceil(over / memory.payload_per_microbatch)
        ways.append(f"{fewer} fewer microbatches in flight per stage (--microbatches, or a "
                    "schedule that holds fewer, as 1F1B)")
    per_iteration = memory.span_bytes_per_iteration
    if per_iteration and per_iteration * (memory.iterations - 1) > over:
        ways.append(f"--iterations {memory.iterations - math.ceil(over / per_iteration)}")
    if memory.connection_bytes > over:
        ways.append(f"{math.ceil(over / CONNECTION_BYTES):,} fewer TCP connections")
    if not ways:
        return "; use fewer GPUs, or `testbed simulate`"
    return "; try " + " or ".join(ways)


@dataclass(frozen=True)
class MemoryUse:
    """What a run measured: its workers' peak resident sets (each one's high-water mark,
    summed, and the largest) and the coordinator's."""

    workers_peak: int
    largest_worker: str | None
    largest_worker_peak: int
    coordinator_peak: int


def measured_memory(peaks: Mapping[str, int], coordinator_peak: int) -> MemoryUse:
    largest = max(peaks, key=lambda gpu: peaks[gpu], default=None)
    return MemoryUse(sum(peaks.values()), largest, peaks[largest] if largest else 0,
                     coordinator_peak)


def coordinator_peak() -> int:
    """The most memory this process has held resident (its maximum resident set)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def coordinator_now() -> int:
    """This process's resident memory now."""
    return resident_bytes(os.getpid()) or 0
