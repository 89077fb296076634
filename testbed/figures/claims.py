"""The paper's claims as data: what each states, which runs measure it, and how a figure
follows from their results. Pure: running and drawing live in testbed.figures.measure
and testbed.figures.render."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from testbed.common.choices import BackendName
from testbed.job.model import Job
from testbed.metrics.summary import speedup
from testbed.topology.model import Topology

Backend = BackendName
BACKENDS: tuple[Backend, ...] = ("simulate", "emulate")


@dataclass(frozen=True)
class RunAsk:
    """One training run a claim needs, on the conditions' topology and job."""

    key: str
    """Its name inside the claim ("atlas", "gpipe", "dcs=2")."""
    policy: str
    options: tuple[tuple[str, str], ...] = ()
    bubbles: str | None = None
    sets: tuple[str, ...] = ()
    """Job overrides, KEY=VALUE (as `--set`)."""
    dcs: int | None = None
    """Only the topology's first N datacenters (the rest are left out)."""

    def label(self) -> str:
        parts = [self.policy + (f"+{self.bubbles}" if self.bubbles else "")]
        parts += [f"-o {k}={v}" for k, v in self.options]
        parts += [f"--set {s}" for s in self.sets]
        return " ".join(parts)


@dataclass(frozen=True)
class RunFigures:
    """What a claim reads from one run's results."""

    iteration_s: float | None
    tokens_per_s: float | None
    utilization_training: float | None
    utilization_total: float | None
    plan: str
    """`dp x pp` and the DCs used, for the tables."""
    gpus: int | None = None
    """GPUs the plan trains on (dp x pp x tp)."""
    wan_utilization: float | None = None
    requests: Requests | None = None
    """Inference requests, for a run that kept score of them."""


@dataclass(frozen=True)
class Requests:
    """What became of a run's inference requests (results' `inference`)."""

    arrived: int
    served: int
    expired: int | None
    """Of the served, those whose first token came after the deadline."""
    rejected: int
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    prefills: int | None = None
    overran: int | None = None
    """Prefills that held training past their bubble."""


@dataclass(frozen=True)
class TransferFigures:
    """One activation across a WAN link Atlas's plan uses, windows open."""

    one_s: float
    many_s: float
    connections: int
    link: str
    many_paced_s: float | None = None
    """Emulator: the striped transfer with every connection paced, where runs leave a
    message this small unpaced (testbed.plan.pacing): what bursts through this machine's
    shaper cost."""


Measured = Mapping[str, RunFigures]
Value = Callable[[Measured], "float | None"]


@dataclass(frozen=True)
class ClaimSpec:
    id: str
    claim: str
    paper: str
    """What the paper states, in its words where we have them."""
    unit: Literal["x", "%", "of linear"]
    runs: tuple[RunAsk, ...]
    value: Value
    target: float | None = None
    """Where ours should be at least (at most for a slowdown), when there is a target."""
    at_most: bool = False


@dataclass(frozen=True)
class Conditions:
    """A topology whose values are sourced in its comments, and the load for bubbles."""

    topology: str
    """Path, as a reader would type it."""
    summary: str
    requests_per_s: int = 400
    """Prefill arrivals while BubbleTea is measured: enough to find every bubble a
    request (a busier load only lengthens the queue)."""
    bubble_iterations: int = 3


SPEEDUPS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "pp_vs_dp": ("1f1b", ("dp-across-dc",)),
    "temporal": ("temporal", ("fair",)),
    "atlas_vs_pipelines": ("atlas", ("gpipe", "1f1b")),
    "atlas_vs_dp": ("atlas", ("dp-across-dc",)),
    "dc_selection": ("atlas", ("every-dc",)),
}
"""Speed-up claims: the run measured, and the baselines whose best it is measured against
(keys of the claim's runs)."""


def _ratio(claim_id: str) -> Value:
    """The run's speed-up over the best baseline: a ratio of tokens/s, as `compare` has it."""
    fast, names = SPEEDUPS[claim_id]

    def value(runs: Measured) -> float | None:
        rates = [r for r in (runs[n].tokens_per_s for n in names) if r]
        return speedup(runs[fast].tokens_per_s, max(rates, default=None))

    return value


def _percent(key: str, field: Literal["idle", "total"]) -> Value:
    def value(runs: Measured) -> float | None:
        run = runs[key]
        if field == "idle":
            return None if run.utilization_training is None else \
                100 * (1 - run.utilization_training)
        return None if run.utilization_total is None else 100 * run.utilization_total

    return value


def _slowdown(filled: str, reference: str) -> Value:
    """How much longer the same tokens take with bubbles filled, in percent."""
    def value(runs: Measured) -> float | None:
        ratio = speedup(runs[reference].tokens_per_s, runs[filled].tokens_per_s)
        return None if ratio is None else 100 * (ratio - 1)

    return value


def _weak_scaling(counts: int) -> Value:
    def value(runs: Measured) -> float | None:
        one = runs["dcs=1"].tokens_per_s
        last = runs[f"dcs={counts}"].tokens_per_s
        return last / (counts * one) if one and last else None

    return value


MULTI_TCP = "multi_tcp"
"""Measured by a transfer, not by training runs (testbed.figures.measure)."""


def claims(topology: Topology, job: Job, conditions: Conditions) -> list[ClaimSpec]:
    """Every claim on this topology and job (whose batch is that of all the DCs)."""
    dcs = len(topology.datacenters)
    batch = job.global_batch or job.microbatch_size * (job.microbatches or 1) * (job.dp or 1)
    per_dc = max(1, batch // dcs)
    # the batch, not the microbatches per replica, grows with the DCs
    unset = ("microbatches=",) if job.global_batch is None else ()
    scaling = tuple(RunAsk(f"dcs={k}", "atlas", sets=(f"global_batch={per_dc * k}", *unset),
                           dcs=k) for k in range(1, dcs + 1))
    bubbles = (f"inference.arrival_rate={conditions.requests_per_s}/s",
               f"iterations={conditions.bubble_iterations}")
    forced = (f"dp={max(1, min(dc.gpus for dc in topology.datacenters) // job.tp)}",
              f"pp={dcs}")
    one_stage = (("two_per_gpu", "off"),)  # each GPU one stage, as the paper places them
    return [
        ClaimSpec(MULTI_TCP, "Multiple TCP connections cut data-transfer time",
                  "up to 20x", "x", (), lambda _runs: None, target=20),
        ClaimSpec("pp_vs_dp", "Pipeline parallelism across DCs beats data parallelism "
                  "across DCs (1 connection, fair sharing, torch's 1F1B)",
                  "PP across DCs, DP inside (stated)", "x",
                  (RunAsk("1f1b", "1f1b"), RunAsk("dp-across-dc", "dp-across-dc")),
                  _ratio("pp_vs_dp")),
        ClaimSpec("temporal", "Temporal WAN sharing alone, every DC's GPUs one stage "
                  "(dp x pp as the paper's Algorithm 1 places its testbed)",
                  "up to 1.82x, also against multiple connections", "x",
                  (RunAsk("fair", "atlas-no-temporal", one_stage, sets=forced),
                   RunAsk("temporal", "atlas", one_stage, sets=forced)),
                  _ratio("temporal"), target=1.8),
        ClaimSpec("atlas_vs_pipelines", "Atlas against the better of GPipe and 1F1B "
                  "(torch's sends, 1 connection, fair sharing)", "up to 17x", "x",
                  (RunAsk("atlas", "atlas"), RunAsk("gpipe", "gpipe"),
                   RunAsk("1f1b", "1f1b")),
                  _ratio("atlas_vs_pipelines"), target=17),
        ClaimSpec("atlas_vs_dp", "Atlas against data parallelism across DCs", "up to 17x",
                  "x", (RunAsk("atlas", "atlas"), RunAsk("dp-across-dc", "dp-across-dc")),
                  _ratio("atlas_vs_dp"), target=17),
        ClaimSpec("weak_scaling", "Throughput as DCs are added, the batch growing with the "
                  "GPUs (Atlas; all DCs against one)", "throughput scales as DCs are added",
                  "of linear", scaling, _weak_scaling(dcs), target=0.8),
        ClaimSpec("dc_selection", "Forcing every DC in, against Atlas's selection",
                  "an extra, far or small DC can slow the job", "x",
                  (RunAsk("atlas", "atlas"), RunAsk("every-dc", "atlas-no-selection")),
                  _ratio("dc_selection")),
        ClaimSpec("bubbles_after_atlas", "Idle GPU time left by Atlas's schedule",
                  "bubbles remain (stated)", "%", (RunAsk("atlas", "atlas"),),
                  _percent("atlas", "idle")),
        ClaimSpec("bubbletea_utilization", "GPU utilization with BubbleTea's prefills",
                  "up to 94%", "%",
                  (RunAsk("bubbletea", "atlas", bubbles="bubbletea", sets=bubbles),),
                  _percent("bubbletea", "total"), target=90),
        ClaimSpec("bubbletea_slowdown", "Training slowdown from BubbleTea's prefills",
                  "no impact on training", "%",
                  (RunAsk("none", "atlas", sets=bubbles),
                   RunAsk("bubbletea", "atlas", bubbles="bubbletea", sets=bubbles)),
                  _slowdown("bubbletea", "none"), target=1, at_most=True),
    ]


def multi_tcp_link(topology: Topology, connections: Iterable[tuple[str, str, int]]
                   ) -> tuple[tuple[str, str], int] | None:
    """Of a plan's (DC, DC, connections) across the WAN, the link with the most connections
    (the longest such, by latency) and that count; None when it crosses no link directly."""
    direct = {tuple(sorted(link.pair)): link for link in topology.links}
    used = [(n, direct[(a, b)].latency_s, (a, b)) for a, b, n in connections
            if (a, b) in direct]
    if not used:
        return None
    n, _, link = max(used)
    return link, n
